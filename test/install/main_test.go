// Package install checks nodeguard as a platform team installs and removes it,
// on the local cluster (kube-apiserver with RBAC and an audit log,
// kube-controller-manager, kube-scheduler, kwok):
//
//   - the kustomize base is valid against the real API server (server-side
//     dry-run);
//   - nodeguard runs under exactly the generated ClusterRole and the
//     leader-election Role, impersonating its ServiceAccount: the guard, the
//     drain, the taint watcher and the secure metrics endpoint work, no request
//     is forbidden, and every granted verb is used (so removing any rule makes a
//     request fail, which this test notices);
//   - the ValidatingAdmissionPolicies of the install refuse, to every user
//     but the identities they name, the changes of the node fields nodeguard
//     trusts, and nothing else;
//   - the kustomize uninstall (manifests/uninstall) deletes everything the
//     install creates but the CRD and the shared namespace;
//   - nodeguard uninstall, with the policies in place, leaves no node with
//     the finalizer, and nodes can be deleted afterwards without nodeguard.
package install

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeguard/nodeguard/test/harness"
)

var (
	env      *harness.Env
	baseYAML string // kubectl kustomize manifests/default
	// installYAML is manifests/default with every permission nodeguard can
	// be granted: plus the component blocked-pdb-replace.
	installYAML string
)

// kustomizeWith builds manifests/default with the given components (dirs
// under manifests/components) from a kustomization of its own in dir.
func kustomizeWith(dir string, components ...string) (string, error) {
	manifests := filepath.Join(harness.RepoRoot(), "manifests")
	rel, err := filepath.Rel(dir, manifests) // kustomize refuses absolute paths
	if err != nil {
		return "", err
	}
	k := "resources:\n- " + filepath.Join(rel, "default") + "\ncomponents:\n"
	for _, c := range components {
		k += "- " + filepath.Join(rel, "components", c) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return "", err
	}
	out, err := kubectlKustomize(dir)
	if err != nil {
		return "", fmt.Errorf("manifests/default with %v: %w", components, err)
	}
	return out, nil
}

// kubectlKustomize builds the kustomization in dir.
func kubectlKustomize(dir string) (string, error) {
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("kubectl kustomize %s: %w\n%s", dir, err, stderr)
	}
	return string(out), nil
}

// auditPolicy records every request's metadata: the least-privilege test reads
// which requests nodeguard's ServiceAccount made and how they were answered.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodeguard-install-")
	if err != nil {
		panic(err)
	}
	code := run(m, dir)
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(m *testing.M, dir string) int {
	flag.Parse()
	if testing.Short() {
		return m.Run() // every test here needs the cluster
	}
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(harness.RepoRoot(), "manifests", "default")).Output()
	if err != nil {
		os.Stderr.WriteString("kubectl kustomize manifests/default: " + err.Error() + "\n")
		return 1
	}
	baseYAML = string(out)
	overlay := filepath.Join(dir, "install")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		panic(err)
	}
	if installYAML, err = kustomizeWith(overlay, "blocked-pdb-replace"); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		return 1
	}
	// envtest installs the base's webhook configurations (same names, same
	// rules and failure policies), pointed at the local webhook server.
	var webhooks []string
	for _, doc := range strings.Split(baseYAML, "\n---\n") {
		if strings.Contains(doc, "kind: MutatingWebhookConfiguration") || strings.Contains(doc, "kind: ValidatingWebhookConfiguration") {
			webhooks = append(webhooks, doc)
		}
	}
	webhookDir := filepath.Join(dir, "webhooks")
	if err := os.MkdirAll(webhookDir, 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(filepath.Join(webhookDir, "webhooks.yaml"), []byte(strings.Join(webhooks, "\n---\n")), 0o644); err != nil {
		panic(err)
	}
	// The install (applyRBAC, from installYAML) ships kube-node-maintenance.
	return harness.Run(m, harness.Options{Cluster: true, WebhookManifests: []string{webhookDir}, AuditPolicy: auditPolicy, NoMaintenanceNamespace: true,
		// The API server presents a client certificate to webhooks, as a
		// hardened cluster does: nodeguard with --webhook-client-ca verifies it,
		// nodeguard without asks for none.
		WebhookClientCert: true}, &env)
}
