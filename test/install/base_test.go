package install

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/test/harness"
)

// stubCRDs stand in for the Prometheus Operator's CRDs, which this cluster
// does not have: they accept any spec, so the dry-run below checks those
// objects' kind, scope and metadata, not their spec. cert-manager's CRDs are
// the real ones (make tools copies them from cert-manager's module), so the
// Issuers and Certificates are validated in full.
const stubCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor, listKind: ServiceMonitorList}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: prometheusrules.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: PrometheusRule, plural: prometheusrules, singular: prometheusrule, listKind: PrometheusRuleList}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
`

// TestKustomizeIsValidOnTheServer applies the base and the AKS example overlay
// (every component) with a server-side dry-run: the API server validates
// every object, the CRD and the webhook configurations included.
func TestKustomizeIsValidOnTheServer(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t) // the namespace must exist for a dry-run of namespaced objects
	harness.MustKubectl(t, env.Kubeconfig, stubCRDs, "apply", "-f", "-")
	harness.MustKubectl(t, env.Kubeconfig, "", "apply", "--server-side", "-f", filepath.Join(harness.BinDir(), "cert-manager-crds"))
	// Polled here: kubectl wait fails on a CRD whose status has no conditions
	// yet, as one just created may.
	for _, name := range []string{"issuers.cert-manager.io", "certificates.cert-manager.io",
		"servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com"} {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
				return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
			}), nil
		}, "CRD %s is established", name)
	}
	for _, dir := range []string{"default", "overlays/aks"} {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command("kubectl", "kustomize", filepath.Join(harness.RepoRoot(), "manifests", dir)).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize manifests/%s: %v", dir, err)
			}
			// The webhook configurations exist already, as envtest installed
			// them pointing at the local server (a URL, not the Service):
			// dry-run them under other names, as new objects.
			manifests := strings.ReplaceAll(string(out), "-webhook-configuration\n", "-webhook-configuration-dryrun\n")
			got := harness.MustKubectl(t, env.Kubeconfig, manifests, "apply", "--server-side", "--dry-run=server", "-f", "-")
			objects := strings.Count(string(out), "\nkind: ")
			if lines := strings.Count(strings.TrimSpace(got), "\n") + 1; lines != objects {
				t.Errorf("dry-run applied %d objects of %d:\n%s", lines, objects, got)
			}
			for _, want := range []string{
				"customresourcedefinition.apiextensions.k8s.io/nodedisruptionbudgets.nodeguard.io",
				"deployment.apps/nodeguard", "validatingwebhookconfiguration.admissionregistration.k8s.io/nodeguard-validating-webhook-configuration",
				"certificate.cert-manager.io/nodeguard-serving-cert", "certificate.cert-manager.io/nodeguard-ca",
				"issuer.cert-manager.io/nodeguard-ca-issuer", "namespace/kube-node-maintenance",
			} {
				if !strings.Contains(got, want) {
					t.Errorf("dry-run output lacks %s:\n%s", want, got)
				}
			}
		})
	}
}

// TestKustomizeUninstallKeepsTheCRDAndTheSharedNamespace: manifests/uninstall
// (the documented kubectl delete -k) lists every object manifests/default
// installs, unchanged, but the NodeDisruptionBudget CRD (deleting it deletes
// every budget) and the namespace kube-node-maintenance (other tools' Leases),
// so that it leaves nothing else behind; the component does the same to an
// overlay (the AKS example). Then, on the API server, a server-side dry run
// of the delete deletes neither, though both exist.
func TestKustomizeUninstallKeepsTheCRDAndTheSharedNamespace(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t) // kube-node-maintenance and nodeguard's objects exist
	kept := []string{"CustomResourceDefinition /nodedisruptionbudgets.nodeguard.io", "Namespace /kube-node-maintenance"}
	build := func(dir string) map[string]string {
		t.Helper()
		out, err := kubectlKustomize(dir)
		if err != nil {
			t.Fatal(err)
		}
		objs := map[string]string{}
		for _, doc := range strings.Split(out, "\n---\n") {
			var o struct {
				Kind     string `json:"kind"`
				Metadata struct{ Namespace, Name string }
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			objs[o.Kind+" "+o.Metadata.Namespace+"/"+o.Metadata.Name] = strings.TrimSpace(doc)
		}
		return objs
	}
	manifests := filepath.Join(harness.RepoRoot(), "manifests")
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, manifests)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte("resources:\n- "+filepath.Join(rel, "overlays", "aks")+
		"\ncomponents:\n- "+filepath.Join(rel, "components", "uninstall")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for install, uninstall := range map[string]string{
		filepath.Join(manifests, "default"):         filepath.Join(manifests, "uninstall"),
		filepath.Join(manifests, "overlays", "aks"): overlay,
	} {
		installed, deleted := build(install), build(uninstall)
		for _, k := range kept {
			if _, ok := installed[k]; !ok {
				t.Errorf("%s does not install %s", install, k)
			}
			if _, ok := deleted[k]; ok {
				t.Errorf("%s deletes %s", uninstall, k)
			}
		}
		for k, doc := range installed {
			if slices.Contains(kept, k) {
				continue
			}
			if got, ok := deleted[k]; !ok {
				t.Errorf("%s leaves %s behind", uninstall, k)
			} else if got != doc {
				t.Errorf("%s deletes %s as another object:\n%s\nwant\n%s", uninstall, k, got, doc)
			}
		}
		for k := range deleted {
			if _, ok := installed[k]; !ok {
				t.Errorf("%s deletes %s, which %s does not install", uninstall, k, install)
			}
		}
	}

	got := harness.MustKubectl(t, env.Kubeconfig, "", "delete", "-k", filepath.Join(manifests, "uninstall"), "--dry-run=server", "--ignore-not-found")
	for _, want := range []string{"serviceaccount \"nodeguard\" deleted", "role.rbac.authorization.k8s.io \"nodeguard\" deleted", "namespace \"nodeguard-system\" deleted"} {
		if !strings.Contains(got, want) {
			t.Errorf("the dry run of kubectl delete -k manifests/uninstall does not say %s:\n%s", want, got)
		}
	}
	for _, never := range []string{"customresourcedefinition", "kube-node-maintenance"} {
		if strings.Contains(got, never) {
			t.Errorf("kubectl delete -k manifests/uninstall deletes %s:\n%s", never, got)
		}
	}
	var ns corev1.Namespace
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: "kube-node-maintenance"}, &ns); err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("kube-node-maintenance: %v (deleting since %v)", err, ns.DeletionTimestamp)
	}
}
