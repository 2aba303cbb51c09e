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

	"github.com/nodeguard/nodeguard/azure/config"
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
	for _, doc := range strings.Split(installYAML, "\n---\n") {
		for _, kind := range rbacKinds {
			if strings.Contains(doc, "\nkind: "+kind+"\n") {
				docs = append(docs, doc)
			}
		}
	}
	cmd := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "apply", "--server-side", "-f", "-")
	cmd.Stdin = strings.NewReader(strings.Join(docs, "\n---\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("applying the install's RBAC: %v\n%s", err, out)
	}
	return nil
})

// applyRBAC applies the namespaces, ServiceAccount, roles and bindings of the
// install (installYAML) for real, once.
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
// election in nodeguard-system, against Azure as az plays it.
func startNodeguard(t *testing.T, az *azureFixture, extra ...string) *harness.Nodeguard {
	t.Helper()
	args := append([]string{
		"--kubeconfig=" + serviceAccountKubeconfig(t),
		"--health-probe-bind-address=0",
		"--leader-elect=true", "--leader-election-namespace=" + namespace, "--leader-election-id=" + strings.ToLower(t.Name()),
	}, env.WebhookArgs()...)
	args = append(args, az.args...)
	return harness.StartNodeguard(t, env.Client, append(args, extra...)...)
}

const (
	tenantID = "11111111-1111-1111-1111-111111111111"
	clientID = "22222222-2222-2222-2222-222222222222"
)

// azureFixture is Azure as nodeguard meets it on AKS with a client secret:
// Microsoft Entra ID (the emulator's token endpoint, over HTTPS that nodeguard
// trusts through SSL_CERT_FILE) and ARM (the emulator behind a Front that
// answers 401 to any token the endpoint did not issue).
type azureFixture struct {
	emu    *armemulator.Server
	front  *armemulator.Front
	tokens *armemulator.TokenEndpoint
	// secret is the client secret: in azure.json, or in $AZURE_CLIENT_SECRET
	// with inEnv.
	secret string
	// args point nodeguard at it.
	args []string
}

// newAzure serves the seed's resource group and a token endpoint for the
// client secret, for the test. It sets SSL_CERT_FILE for the test process,
// which passes it on to the nodeguard it starts.
func newAzure(t *testing.T, seed armemulator.Seed, secret string, inEnv bool) *azureFixture {
	t.Helper()
	// Build nodeguard before SSL_CERT_FILE trusts the token endpoint alone.
	if _, err := harness.NodeguardBinary(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokens, err := armemulator.StartTokenEndpoint(tenantID, clientID, secret, filepath.Join(dir, "entra-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tokens.Close)
	t.Setenv("SSL_CERT_FILE", tokens.CAFile())
	emu := armemulator.New(seed, armemulator.Options{})
	front, err := armemulator.StartFront(fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), emu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	front.RequireBearer(tokens.IssuedToken)
	fileSecret := secret
	if inEnv {
		t.Setenv(config.EnvClientSecret, secret)
		fileSecret = ""
	}
	azureConfig := filepath.Join(dir, "azure.json")
	if err := os.WriteFile(azureConfig, []byte(azureJSON(fileSecret)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &azureFixture{emu: emu, front: front, tokens: tokens, secret: secret, args: []string{
		"--azure-config=" + azureConfig, "--azure-arm-endpoint=" + front.URL(), "--azure-authority-host=" + tokens.AuthorityHost(),
	}}
}

// requireTokensUsed fails unless nodeguard bought a token with the secret and
// every ARM call carried one the endpoint issued.
func (az *azureFixture) requireTokensUsed(t *testing.T) {
	t.Helper()
	if len(az.tokens.Issued()) == 0 {
		t.Error("nodeguard never bought a token with its client secret")
	}
	if n := az.front.Unauthorized(); n > 0 {
		t.Errorf("%d ARM calls carried no token the endpoint issued", n)
	}
	if len(az.emu.Requests()) == 0 {
		t.Error("nodeguard made no ARM call")
	}
}

// azureJSON is an azure.json for the emulator's subscription and resource
// group, as on AKS nodes: with the client secret when it is not empty.
func azureJSON(secret string) string {
	return fmt.Sprintf(`{"cloud": "AzurePublicCloud", "tenantId": %q,
  "subscriptionId": %q, "resourceGroup": %q, "aadClientId": %q,
  "aadClientSecret": %q, "loadBalancerSku": "standard", "vmType": "vmss"}`, tenantID, subscription, resourceGroup, clientID, secret)
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
