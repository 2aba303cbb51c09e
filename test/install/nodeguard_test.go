package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	namespace      = "nodeguard-system"
	serviceAccount = "system:serviceaccount:nodeguard-system:nodeguard"
	subscription   = "00000000-0000-0000-0000-000000000000"
	resourceGroup  = "mc_install"
)

// rbacKinds are the base's objects that make up nodeguard's permissions.
var rbacKinds = []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

var installRBAC = sync.OnceValue(func() error {
	var docs []string
	for _, doc := range strings.Split(baseYAML, "\n---\n") {
		for _, kind := range rbacKinds {
			if strings.Contains(doc, "\nkind: "+kind+"\n") {
				docs = append(docs, doc)
			}
		}
	}
	cmd := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "apply", "--server-side", "-f", "-")
	cmd.Stdin = strings.NewReader(strings.Join(docs, "\n---\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("applying the base's RBAC: %v\n%s", err, out)
	}
	return nil
})

// applyRBAC applies the namespace, ServiceAccount, roles and bindings of the
// kustomize base for real, once.
func applyRBAC(t *testing.T) {
	t.Helper()
	if err := installRBAC(); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountKubeconfig writes a kubeconfig that impersonates nodeguard's
// ServiceAccount: requests get exactly its permissions.
func serviceAccountKubeconfig(t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = serviceAccount
	}
	path := filepath.Join(t.TempDir(), "nodeguard.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// startNodeguard runs the binary as nodeguard's ServiceAccount with leader
// election in nodeguard-system, against the ARM emulator through an azure.json.
func startNodeguard(t *testing.T, emu *armemulator.Server, azureJSON string, extra ...string) *harness.Nodeguard {
	t.Helper()
	azureConfig := filepath.Join(t.TempDir(), "azure.json")
	if err := os.WriteFile(azureConfig, []byte(azureJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--kubeconfig=" + serviceAccountKubeconfig(t),
		"--health-probe-bind-address=0",
		"--leader-elect=true", "--leader-election-namespace=" + namespace, "--leader-election-id=" + strings.ToLower(t.Name()),
		"--azure-config=" + azureConfig, "--azure-arm-endpoint=" + emu.URL(), "--azure-credential=none",
	}, env.WebhookArgs()...)
	return harness.StartNodeguard(t, env.Client, append(args, extra...)...)
}

// azureJSON is an azure.json for the emulator's subscription and resource
// group, with a client secret that must never show up in logs or events.
func azureJSON(secret string) string {
	return fmt.Sprintf(`{"cloud": "AzurePublicCloud", "tenantId": "11111111-1111-1111-1111-111111111111",
  "subscriptionId": %q, "resourceGroup": %q, "aadClientId": "22222222-2222-2222-2222-222222222222",
  "aadClientSecret": %q, "loadBalancerSku": "standard", "vmType": "vmss"}`, subscription, resourceGroup, secret)
}

// barePod is a pod bound to a node, with no controller.
func barePod(ns, name, node string, annotations map[string]string) *corev1.Pod {
	p := &corev1.Pod{}
	p.Namespace, p.Name, p.Annotations = ns, name, annotations
	p.Labels = map[string]string{"app": name}
	p.Spec.NodeName = node
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "fake"}}
	p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	return p
}

// waitRunning waits for a pod to run (kwok).
func waitRunning(t *testing.T, ns, name string) {
	t.Helper()
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)
		return err == nil && p.Status.Phase == corev1.PodRunning, client.IgnoreNotFound(err)
	}, "pod %s/%s runs", ns, name)
}
