package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestBudgetDrainTimeoutBoundsADoNotEvictHold: a tenant's pod annotated
// nodeguard.io/do-not-evict would hold the deletion of its node for ever
// (nodeguard runs without --drain-timeout). The NodeDisruptionBudget over the
// pool sets drainTimeout: 30s, which kubectl get ndb shows; the deleted node is
// held past its other pods' drain, then released once the 30 s have passed,
// the held pod deleted.
func TestBudgetDrainTimeoutBoundsADoNotEvictHold(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	ns := freshName("ndbdeadline")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	var vms []armemulator.Node
	for i := range 2 {
		name := fmt.Sprintf("%s-%d", ns, i)
		ip := fmt.Sprintf("10.82.0.%d", 4+i)
		vms = append(vms, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: vmssProviderID(130 + i)})
		harness.MustCreate(t, env.Client, builder.Node(name, builder.WithLabels("pool", ns), builder.WithProviderID(vmssProviderID(130+i)), builder.WithInternalIP(ip)))
	}
	target := ns + "-0"
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "tenant", 1, builder.OnNodes(corev1.LabelHostname, target),
		builder.WithPodAnnotations(ngv1alpha1.DoNotEvictAnnotation, "true")))
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 2, builder.OnNodes("pool", ns)))
	ndb := builder.NDB(ns, builder.NDBSelecting("pool", ns), builder.NDBMaxUnavailable("1"))
	ndb.Spec.DrainTimeout = &metav1.Duration{Duration: 30 * time.Second}
	harness.MustCreate(t, env.Client, ndb)
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, vms, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := env.Client.List(ctx, &pods, client.InNamespace(ns))
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 3, err
	}, "the tenant's pod and the web pods run")
	startNodeguard(t, env.Kubeconfig, emu)
	waitForBudgetAllowed(t, ns, 1)

	out, err := harness.Kubectl(env.Kubeconfig, "", "get", "ndb", ns)
	if err != nil || !strings.Contains(out, "DRAIN TIMEOUT") || !strings.Contains(out, "30s") {
		t.Errorf("kubectl get ndb does not show the drain timeout (%v):\n%s", err, out)
	}

	// The first delete may be told to retry: nodeguard has just put its
	// finalizer on the nodes it found at start-up.
	var deleted time.Time
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		deleted = time.Now()
		out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", target, "--wait=false")
		if err != nil && !strings.Contains(out, "retry the delete") {
			return false, fmt.Errorf("kubectl delete node: %w\n%s", err, out)
		}
		return err == nil, nil
	}, "kubectl delete node %s is admitted", target)
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, target)
	}, "%s is released once the budget's drain timeout has passed", target)
	if held := time.Since(deleted); held < 25*time.Second {
		t.Errorf("%s was released %s after its deletion: the do-not-evict pod was not waited for", target, held.Round(time.Second))
	}
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == target && p.DeletionTimestamp == nil {
			t.Errorf("pod %s is left on the released node", p.Name)
		}
	}
}
