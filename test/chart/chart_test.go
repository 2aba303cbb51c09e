// Package chart renders nodeguard's Helm chart with default and non-default
// values and checks it against the kustomize manifests. It is a module of its
// own so that Helm's dependencies stay out of nodeguard's go.mod.
package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	release   = "nodeguard"
	namespace = "nodeguard-system"
)

var root = filepath.Join("..", "..")

type object = map[string]any

func key(o object) string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	return fmt.Sprintf("%s %s/%s", o["kind"], ns, md["name"])
}

func splitDocs(t *testing.T, src, text string) []object {
	t.Helper()
	var out []object
	for _, doc := range strings.Split(text, "\n---") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", src, err, doc)
		}
		if len(o) > 0 {
			out = append(out, o)
		}
	}
	return out
}

// renderErr renders the chart's files with values, checked against
// values.schema.json first, as helm install does.
func renderErr(t *testing.T, values string) (map[string]string, error) {
	t.Helper()
	return renderChecked(t, values, true)
}

// renderChecked renders the chart's files with values; schema false skips
// values.schema.json, as helm install --skip-schema-validation does.
func renderChecked(t *testing.T, values string, schema bool) (map[string]string, error) {
	t.Helper()
	c := loadChart(t)
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	rv, err := util.ToRenderValuesWithSchemaValidation(c, vals, common.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true},
		common.DefaultCapabilities, !schema)
	if err != nil {
		return nil, err
	}
	return engine.Render(c, rv)
}

func loadChart(t *testing.T) *chartv2.Chart {
	t.Helper()
	c, err := loader.Load(filepath.Join(root, "charts", "nodeguard"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// render renders the chart's templates with the values (YAML) as helm
// install would, and returns the objects by key.
func render(t *testing.T, values string) map[string]object {
	t.Helper()
	files, err := renderErr(t, values)
	if err != nil {
		t.Fatalf("rendering the chart: %v", err)
	}
	out := map[string]object{}
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, o := range splitDocs(t, name, text) {
			k := key(o)
			if _, dup := out[k]; dup {
				t.Errorf("the chart renders %s twice", k)
			}
			out[k] = o
		}
	}
	return out
}

// kustomize builds a kustomization under manifests/ and returns the objects
// by key.
func kustomize(t *testing.T, dir string) map[string]object {
	t.Helper()
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(root, "manifests", dir)).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize manifests/%s: %v", dir, err)
	}
	objs := map[string]object{}
	for _, o := range splitDocs(t, dir, string(out)) {
		objs[key(o)] = o
	}
	return objs
}

// helmOnly strips what only Helm adds: its labels and resource policy, and
// hook objects.
func helmOnly(objs map[string]object) map[string]object {
	out := map[string]object{}
	for k, o := range objs {
		md := o["metadata"].(map[string]any)
		ann, _ := md["annotations"].(map[string]any)
		if ann["helm.sh/hook"] != nil {
			continue
		}
		if ann != nil {
			delete(ann, "helm.sh/resource-policy")
			if len(ann) == 0 {
				delete(md, "annotations")
			}
		}
		if labels, ok := md["labels"].(map[string]any); ok {
			delete(labels, "helm.sh/chart")
			delete(labels, "app.kubernetes.io/managed-by")
		}
		out[k] = o
	}
	return out
}

func asJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// compare checks that the chart and kustomize produce the same objects; the
// release namespace (helm install --create-namespace) and the CRD (the chart's
// crds/) are kustomize's only.
func compare(t *testing.T, chart, kust map[string]object) {
	t.Helper()
	chart = helmOnly(chart)
	for k, want := range kust {
		if k == "Namespace /"+namespace || want["kind"] == "CustomResourceDefinition" {
			continue
		}
		got, ok := chart[k]
		if !ok {
			t.Errorf("the chart does not render %s", k)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs:\nchart:\n%s\nkustomize:\n%s", k, asJSON(got), asJSON(want))
		}
	}
	for k := range chart {
		if _, ok := kust[k]; !ok {
			t.Errorf("the chart renders %s, which kustomize does not", k)
		}
	}
}

func TestDefaultValuesRenderTheKustomizeBase(t *testing.T) {
	compare(t, render(t, `uninstallHook: {enabled: false}`), kustomize(t, "default"))
}

func TestAKSValuesRenderTheAKSOverlay(t *testing.T) {
	compare(t, render(t, `
uninstallHook: {enabled: false}
azure:
  configSecret: nodeguard-azure-config
  workloadIdentity: {clientId: 00000000-0000-0000-0000-000000000000}
metrics:
  serviceMonitor: {enabled: true}
  prometheusRule: {enabled: true}
`), kustomize(t, "overlays/aks"))
}

func deployment(t *testing.T, objs map[string]object) object {
	t.Helper()
	d, ok := objs["Deployment "+namespace+"/nodeguard"]
	if !ok {
		t.Fatal("no Deployment rendered")
	}
	return d
}

func dig(o any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, _ := o.(map[string]any)
			o = m[p]
		case int:
			l, _ := o.([]any)
			if p >= len(l) {
				return nil
			}
			o = l[p]
		}
	}
	return o
}

func TestNonDefaultValues(t *testing.T) {
	objs := render(t, `
replicaCount: 3
image: {repository: example.azurecr.io/nodeguard, tag: v9.9.9}
resources: {requests: {cpu: 50m, memory: 100Mi}, limits: {memory: 300Mi}}
nodeSelector: {kubernetes.azure.com/mode: system}
webhook: {failurePolicy: Ignore}
nodeguard:
  managedNodes: {matchLabels: {kubernetes.azure.com/mode: user}}
  drainTimeout: 1h
  daemonSetPods: skip
  signalTaints: [node.kubernetes.io/out-of-service, "cloudprovider.azure.microsoft.com/draining=spot-eviction"]
  clusterAutoscalerScaleDownHold: false
  outsideDrains: false
  extraArgs: [--max-concurrent-drains=5]
azure:
  configHostPath: /etc/kubernetes/azure.json
  flags: {load-balancers: "kubernetes,kubernetes-internal"}
certManager: {enabled: false}
grafanaDashboard: {enabled: true}
fullnameOverride: guard
`)
	d, ok := objs["Deployment "+namespace+"/guard"]
	if !ok {
		t.Fatalf("no Deployment guard rendered: %v", slices.Sorted(func(yield func(string) bool) {
			for k := range objs {
				if !yield(k) {
					return
				}
			}
		}))
	}
	if got := dig(d, "spec", "replicas"); got != float64(3) {
		t.Errorf("replicas %v, want 3", got)
	}
	c := dig(d, "spec", "template", "spec", "containers", 0)
	if got := dig(c, "image"); got != "example.azurecr.io/nodeguard:v9.9.9" {
		t.Errorf("image %v", got)
	}
	if got := dig(c, "resources", "limits", "memory"); got != "300Mi" {
		t.Errorf("memory limit %v, want 300Mi", got)
	}
	args := fmt.Sprint(dig(c, "args"))
	for _, want := range []string{"--node-selector=kubernetes.azure.com/mode=user", "--drain-timeout=1h", "--daemonset-pods=skip",
		"--signal-taints=node.kubernetes.io/out-of-service,cloudprovider.azure.microsoft.com/draining=spot-eviction", "--cluster-autoscaler-scale-down-hold=false",
		"--outside-drains=false", "--max-concurrent-drains=5", "--azure-config=/etc/kubernetes/azure.json", "--azure-load-balancers=kubernetes,kubernetes-internal"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %s lack %s", args, want)
		}
	}
	if got := dig(d, "spec", "template", "spec", "volumes", 1, "hostPath", "path"); got != "/etc/kubernetes/azure.json" {
		t.Errorf("azure.json host path volume: %v", got)
	}
	if got := dig(d, "spec", "template", "spec", "nodeSelector", "kubernetes.azure.com/mode"); got != "system" {
		t.Errorf("pod nodeSelector %v", got)
	}
	if got := dig(d, "spec", "template", "spec", "volumes", 0, "secret", "secretName"); got != "guard-webhook-server-cert" {
		t.Errorf("webhook cert secret %v", got)
	}
	v := objs["ValidatingWebhookConfiguration /guard-validating-webhook-configuration"]
	if got := dig(v, "webhooks", 0, "failurePolicy"); got != "Ignore" {
		t.Errorf("delete webhook failurePolicy %v, want Ignore", got)
	}
	if webhooks := fmt.Sprint(dig(v, "webhooks")); strings.Contains(webhooks, "eviction.nodeguard.io") {
		t.Errorf("outsideDrains=false still renders the eviction webhook")
	}
	m := objs["MutatingWebhookConfiguration /guard-mutating-webhook-configuration"]
	for what, wh := range map[string]any{"delete": dig(v, "webhooks", 0), "nodeclaim": dig(v, "webhooks", 1), "finalizer": dig(m, "webhooks", 0)} {
		if got := dig(wh, "objectSelector", "matchLabels", "kubernetes.azure.com/mode"); got != "user" {
			t.Errorf("%s webhook objectSelector %v, want the nodes of nodeguard.managedNodes", what, dig(wh, "objectSelector"))
		}
	}
	if got := dig(v, "metadata", "annotations"); got != nil {
		t.Errorf("without cert-manager the webhooks carry no inject-ca-from: %v", got)
	}
	if got := dig(v, "webhooks", 0, "clientConfig", "service", "name"); got != "guard-webhook-service" {
		t.Errorf("webhook service %v", got)
	}
	for k := range objs {
		if strings.HasPrefix(k, "Certificate ") || strings.HasPrefix(k, "Issuer ") {
			t.Errorf("certManager.enabled=false still renders %s", k)
		}
	}
	cm := objs["ConfigMap "+namespace+"/guard-dashboard"]
	dashboard, err := os.ReadFile(filepath.Join(root, "manifests", "prometheus", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := dig(cm, "data", "nodeguard.json"); got != strings.TrimRight(string(dashboard), "\n") {
		t.Errorf("the dashboard ConfigMap does not hold manifests/prometheus/dashboard.json")
	}
	job := objs["Job "+namespace+"/guard-uninstall"]
	if got := fmt.Sprint(dig(job, "spec", "template", "spec", "containers", 0, "args")); !strings.Contains(got, "--deployment=guard") ||
		!strings.Contains(got, "--validating-webhook-configuration=guard-validating-webhook-configuration") {
		t.Errorf("uninstall hook args %s", got)
	}
	if got := dig(job, "metadata", "annotations", "helm.sh/hook"); got != "pre-delete" {
		t.Errorf("the uninstall Job is not a pre-delete hook: %v", got)
	}
}

// TestChartCopiesAreInSync: the chart carries copies of generated and shared
// files (make chart refreshes them).
func TestChartCopiesAreInSync(t *testing.T) {
	for copy, source := range map[string]string{
		"crds/nodeguard.io_nodedisruptionbudgets.yaml": "manifests/crd/nodeguard.io_nodedisruptionbudgets.yaml",
		"files/role.yaml":             "manifests/rbac/role.yaml",
		"files/maintenance-role.yaml": "manifests/maintenance/role.yaml",
		"files/prometheus-rules.yaml": "manifests/prometheus/rules.yaml",
		"files/dashboard.json":        "manifests/prometheus/dashboard.json",
	} {
		got, err := os.ReadFile(filepath.Join(root, "charts", "nodeguard", copy))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(root, source))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/nodeguard/%s differs from %s: run make chart", copy, source)
		}
	}
}

// kustomizeWith builds manifests/default with the given components (dirs under
// manifests/components) from a kustomization of its own.
func kustomizeWith(t *testing.T, components ...string) map[string]object {
	t.Helper()
	dir := t.TempDir()
	manifests, err := filepath.Abs(filepath.Join(root, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, manifests) // kustomize refuses absolute paths
	if err != nil {
		t.Fatal(err)
	}
	k := "resources:\n- " + filepath.Join(rel, "default") + "\ncomponents:\n"
	for _, c := range components {
		k += "- " + filepath.Join(rel, "components", c) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize with %v: %v", components, err)
	}
	objs := map[string]object{}
	for _, o := range splitDocs(t, "components", string(out)) {
		objs[key(o)] = o
	}
	return objs
}

// nodeguard.managedNodes renders what the kustomize component managed-nodes
// adds: --node-selector and the objectSelector of the three webhooks.
func TestManagedNodesRenderTheManagedNodesComponent(t *testing.T) {
	compare(t, render(t, `
uninstallHook: {enabled: false}
nodeguard: {managedNodes: {matchLabels: {nodeguard.io/managed: "true"}}}
`), kustomizeWith(t, "managed-nodes"))
}

// The chart writes nodeguard.managedNodes as the webhooks' objectSelector
// (the NodeClaim webhook's too) and as --node-selector: they must select
// exactly the same nodes.
func TestManagedNodesFlagSelectsTheWebhooksNodes(t *testing.T) {
	objs := render(t, `
nodeguard:
  managedNodes:
    matchLabels: {pool: web, kubernetes.azure.com/mode: user}
    matchExpressions:
    - {key: zone, operator: In, values: [a, b]}
    - {key: tier, operator: NotIn, values: [batch]}
    - {key: gpu, operator: DoesNotExist}
    - {key: kubernetes.azure.com/agentpool, operator: Exists}
`)
	args := fmt.Sprint(dig(deployment(t, objs), "spec", "template", "spec", "containers", 0, "args"))
	flag := regexp.MustCompile(`--node-selector=([^\]]*?)(?: --|\]$)`).FindStringSubmatch(args)
	if flag == nil {
		t.Fatalf("no --node-selector in %s", args)
	}
	fromFlag, err := labels.Parse(flag[1])
	if err != nil {
		t.Fatalf("--node-selector=%s does not parse: %v", flag[1], err)
	}
	for _, wh := range []any{
		dig(objs["ValidatingWebhookConfiguration /nodeguard-validating-webhook-configuration"], "webhooks", 0, "objectSelector"),
		dig(objs["ValidatingWebhookConfiguration /nodeguard-validating-webhook-configuration"], "webhooks", 1, "objectSelector"),
		dig(objs["MutatingWebhookConfiguration /nodeguard-mutating-webhook-configuration"], "webhooks", 0, "objectSelector"),
	} {
		b, _ := json.Marshal(wh)
		var ls metav1.LabelSelector
		if err := json.Unmarshal(b, &ls); err != nil {
			t.Fatal(err)
		}
		fromWebhook, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			t.Fatalf("objectSelector %s: %v", b, err)
		}
		for _, node := range []labels.Set{
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "a", "kubernetes.azure.com/agentpool": "u1"},
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "b", "tier": "web", "kubernetes.azure.com/agentpool": "u1"},
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "c", "kubernetes.azure.com/agentpool": "u1"},
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "a", "tier": "batch", "kubernetes.azure.com/agentpool": "u1"},
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "a", "gpu": "1", "kubernetes.azure.com/agentpool": "u1"},
			{"pool": "web", "kubernetes.azure.com/mode": "user", "zone": "a"},
			{"pool": "db", "kubernetes.azure.com/mode": "user", "zone": "a", "kubernetes.azure.com/agentpool": "u1"},
		} {
			if fromFlag.Matches(node) != fromWebhook.Matches(node) {
				t.Errorf("node %v: --node-selector=%s matches %v, objectSelector %s matches %v",
					node, flag[1], fromFlag.Matches(node), b, fromWebhook.Matches(node))
			}
		}
	}
}

// Values that would split what nodeguard manages from what its webhooks cover
// are refused with a message saying what to set instead: by the values schema,
// and by the templates when the schema is skipped
// (--skip-schema-validation).
func TestManagedNodesRefusesSelectorsThatCannotMirror(t *testing.T) {
	for values, want := range map[string]struct{ schema, template string }{
		"nodeguard: {nodeSelector: pool=web}\n":                                     {"nodeguard.managedNodes", "nodeguard.managedNodes"},
		"webhook: {objectSelector: {matchLabels: {pool: web}}}\n":                   {"nodeguard.managedNodes", "nodeguard.managedNodes"},
		"nodeguard: {managedNodes: {matchLabels: {managed: true}}}\n":               {"at '/nodeguard/managedNodes/matchLabels/managed': got boolean, want string", "quote the value"},
		"nodeguard: {managedNodes: {matchExpressions: [{key: a, operator: Gt}]}}\n": {"at '/nodeguard/managedNodes/matchExpressions/0/operator'", "operator Gt"},
		"nodeguard: {managedNodes: {matchLabel: {pool: web}}}\n":                    {"additional properties 'matchLabel' not allowed", "only matchLabels and matchExpressions"},
	} {
		if _, err := renderErr(t, values); err == nil || !strings.Contains(err.Error(), want.schema) {
			t.Errorf("installing with %q: %v, want an error with %q", values, err, want.schema)
		}
		if _, err := renderChecked(t, values, false); err == nil || !strings.Contains(err.Error(), want.template) {
			t.Errorf("installing with %q and --skip-schema-validation: %v, want an error with %q", values, err, want.template)
		}
	}
}
