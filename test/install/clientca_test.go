package install

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestAPIServerPassesTheWebhookClientCA runs nodeguard with
// --webhook-client-ca against a kube-apiserver configured, as documented,
// with an AdmissionConfiguration whose webhook kubeconfig presents a client
// certificate. While nodeguard trusts another CA, the API server's own calls
// fail the TLS handshake (and the delete with them: failurePolicy Fail). Once
// the CA file holds the API server's CA (reloaded, no restart), kubectl
// delete node reaches nodeguard again: denied by a budget that allows none,
// then admitted, drained and gone once the budget allows one.
func TestAPIServerPassesTheWebhookClientCA(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t)
	ctx := context.Background()
	const node, budget = "client-ca-node", "client-ca"
	harness.MustCreate(t, env.Client, builder.Node(node, builder.WithLabels("pool", budget)))

	apiserverCA, err := os.ReadFile(env.WebhookClientCA)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	// Another CA: the serving certificate's, which never signs client certificates.
	if err := os.WriteFile(caFile+".tmp", mustRead(t, filepath.Join(env.Webhook.LocalServingCertDir, "tls.crt")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(caFile+".tmp", caFile); err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--kubeconfig=" + serviceAccountKubeconfig(t), "--health-probe-bind-address=0", "--metrics-bind-address=0",
		"--leader-elect=true", "--leader-election-namespace=" + namespace, "--leader-election-id=client-ca",
		"--azure-config=", "--webhook-client-ca=" + caFile,
	}, env.WebhookArgs()...)
	harness.StartNodeguard(t, env.Client, args...)
	harness.WaitForTerminationFinalizer(t, env.Client, node)

	deleteNode := func() string {
		out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", node, "--wait=false")
		if err == nil {
			return ""
		}
		return out
	}
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		out := deleteNode()
		return strings.Contains(out, `failed calling webhook "delete.nodeguard.io"`), nil
	}, "while nodeguard trusts another CA, the API server's call fails and the delete is refused")

	if err := os.WriteFile(caFile+".tmp", apiserverCA, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(caFile+".tmp", caFile); err != nil {
		t.Fatal(err)
	}
	// The budget webhook (failurePolicy Fail) admits the budget once the API
	// server's calls pass the handshake.
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, builder.NDB(budget, builder.NDBSelecting("pool", budget), builder.NDBMaxUnavailable("0")))
		return err == nil, nil
	}, "with the API server's CA, the budget webhook admits budget %s", budget)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		out := deleteNode()
		return strings.Contains(out, `admission webhook "delete.nodeguard.io" denied the request`) && strings.Contains(out, budget), nil
	}, "with the API server's CA, nodeguard answers the delete (denied by budget %s)", budget)

	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := env.Client.Get(ctx, client.ObjectKey{Name: budget}, &ndb); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ndb.DeepCopy())
	one := builder.NDB(budget, builder.NDBMaxUnavailable("1")).Spec.MaxUnavailable
	ndb.Spec.MaxUnavailable = one
	if err := env.Client.Patch(ctx, &ndb, patch); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: budget}, &ndb)
		return err == nil && ndb.Status.DisruptionsAllowed == 1, err
	}, "budget %s allows one disruption", budget)
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", node, "--wait=false")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, node)
	}, "the deleted node is drained and released")
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
