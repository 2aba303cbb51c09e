package chart

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"sigs.k8s.io/yaml"
)

// helmLint runs helm lint --strict (Helm's own implementation) on the chart
// with the values (YAML), and returns its findings above INFO.
func helmLint(t *testing.T, values string) []string {
	t.Helper()
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	lint := action.NewLint()
	lint.Strict, lint.Namespace = true, namespace
	res := lint.Run([]string{filepath.Join(root, "charts", "nodeguard")}, vals)
	var out []string
	for _, err := range res.Errors {
		out = append(out, err.Error())
	}
	return out
}

// TestHelmLint: helm lint --strict passes with the default values and with
// every option set, and fails on a value of the wrong type.
func TestHelmLint(t *testing.T) {
	for name, values := range map[string]string{
		"defaults": "",
		"every option": `
replicaCount: 3
image: {repository: example.azurecr.io/nodeguard, tag: v9.9.9, pullPolicy: Always}
imagePullSecrets: [{name: acr}]
webhook: {failurePolicy: Ignore, timeoutSeconds: 10}
certManager: {caDuration: 43800h, duration: 720h}
maintenanceNamespace: {create: false}
nodeguard:
  managedNodes: {matchLabels: {kubernetes.azure.com/mode: user}}
  drainTimeout: 1h
  daemonSetPods: skip
  signalTaints: [node.kubernetes.io/out-of-service]
  clusterAutoscalerScaleDownHold: false
  extraArgs: [--max-concurrent-drains=5]
  logLevel: debug
azure:
  configSecret: nodeguard-azure-config
  workloadIdentity: {clientId: 3f9c2a4e-1b7d-4c55-9e0a-6d2f8b1c7e90}
  flags: {load-balancers: "kubernetes,kubernetes-internal", admin-state-workers: 4}
metrics: {serviceMonitor: {enabled: true, interval: 30s}, prometheusRule: {enabled: true}}
grafanaDashboard: {enabled: true}
uninstallHook: {drainWait: 2m}
protectedFields: {karpenterUsers: [system:serviceaccount:karpenter:karpenter], managedLabelRemovers: [system:serviceaccount:platform:labeller]}
`,
	} {
		if errs := helmLint(t, values); len(errs) > 0 {
			t.Errorf("helm lint --strict with %s values: %s", name, strings.Join(errs, "\n"))
		}
	}
	errs := helmLint(t, "replicaCount: two\n")
	if !strings.Contains(strings.Join(errs, "\n"), "at '/replicaCount': got string, want integer") {
		t.Errorf("helm lint with replicaCount: two: %q, want a schema error naming /replicaCount", errs)
	}
}

// TestValuesSchemaRejectsWrongValues: a value of the wrong type or shape, or
// an unknown key, fails helm install before anything reaches the cluster,
// with a message naming the value.
func TestValuesSchemaRejectsWrongValues(t *testing.T) {
	for values, want := range map[string]string{
		"replicaCount: \"2\"\n":                                             "at '/replicaCount': got string, want integer",
		"replicaCount: 0\n":                                                 "at '/replicaCount'",
		"replicas: 2\n":                                                     "additional properties 'replicas' not allowed",
		"image: example.azurecr.io/nodeguard:v1\n":                          "at '/image': got string, want object",
		"image: {pullPolicy: Sometimes}\n":                                  "at '/image/pullPolicy'",
		"webhook: {failurePolicy: fail}\n":                                  "at '/webhook/failurePolicy'",
		"webhook: {timeoutSeconds: \"5\"}\n":                                "at '/webhook/timeoutSeconds': got string, want integer",
		"webhook: {timeoutSeconds: 45}\n":                                   "at '/webhook/timeoutSeconds'",
		"certManager: {enabled: \"false\"}\n":                               "at '/certManager/enabled': got string, want boolean",
		"certManager: {caDuration: 10y}\n":                                  "at '/certManager/caDuration'",
		"maintenanceNamespace: {create: yes please}\n":                      "at '/maintenanceNamespace/create'",
		"nodeguard: {drainTimeout: 3600}\n":                                 "at '/nodeguard/drainTimeout': got number, want string",
		"nodeguard: {drainTimeout: an hour}\n":                              "at '/nodeguard/drainTimeout'",
		"nodeguard: {daemonSetPods: first}\n":                               "at '/nodeguard/daemonSetPods'",
		"nodeguard: {extraArgs: --max-concurrent-drains=5}\n":               "at '/nodeguard/extraArgs': got string, want array",
		"nodeguard: {extraArgs: [max-concurrent-drains=5]}\n":               "at '/nodeguard/extraArgs/0'",
		"azure: {workloadIdentity: {clientId: nodeguard-identity}}\n":       "at '/azure/workloadIdentity/clientId'",
		"azure: {workloadIdentity: 3f9c2a4e-1b7d-4c55-9e0a-6d2f8b1c7e90}\n": "at '/azure/workloadIdentity': got string, want object",
		"azure: {flags: {--load-balancers: kubernetes}}\n":                  "at '/azure/flags'",
		"azure: {flags: {load-balancers: [kubernetes]}}\n":                  "at '/azure/flags/load-balancers'",
		"metrics: {serviceMonitor: true}\n":                                 "at '/metrics/serviceMonitor': got boolean, want object",
		"uninstallHook: {drainWait: 180}\n":                                 "at '/uninstallHook/drainWait': got number, want string",
		"resources: {limits: {memory: [256Mi]}}\n":                          "at '/resources/limits/memory'",
		"nodeSelector: {kubernetes.azure.com/mode: 1}\n":                    "at '/nodeSelector/kubernetes.azure.com~1mode': got number, want string",
	} {
		_, err := renderErr(t, values)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("installing with %q: %v, want an error with %q", values, err, want)
		}
	}
}
