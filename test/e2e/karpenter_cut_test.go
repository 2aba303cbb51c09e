package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/karpenter"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// slowARMWrite is how long ARM takes to answer a backend pool PUT while a
// Karpenter node is deleted: long enough that Karpenter, which evicts a
// deleted node's pods at once, asks before the cut has landed.
const slowARMWrite = 8 * time.Second

// TestKarpenterDeletedNodeIsCutBeforeItsEvictions (issue #62): real
// Karpenter terminates one of its nodes (its NodeClaim deleted, as kubectl
// delete nodeclaim does): it deletes the Node and evicts its three pods at
// once, while nodeguard is still setting the node's entries Down (ARM takes
// 8 s to answer a pool PUT). Karpenter's requests go through the recording API
// proxy: every eviction of the node's pods that was admitted started after
// all the node's entries were Down (the emulator's history at its start),
// the ones sent before were answered 429 and retried by Karpenter, and
// every pod was evicted, the node removed with its entries Down.
func TestKarpenterDeletedNodeIsCutBeforeItsEvictions(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	harness.InstallKarpenterCRDs(t, env.Client)
	pool := freshName("karpenter-cut")
	emu := karpenterEmulator(t)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	kpProxy := startAPIProxy(t)
	startNodeguard(t, env.Kubeconfig, emu)
	m := &cloudNodeManager{emulator: emu, pool: pool, ips: map[string]string{}}
	m.run(t)
	harness.StartKarpenter(t, kpProxy.Kubeconfig)
	karpenterPool(t, pool)
	t.Cleanup(func() { removeKarpenterPool(t, pool) })

	// Three pods of 1 CPU: one 4-CPU node.
	harness.MustCreate(t, env.Client, builder.Deployment(pool, "web", 3, onKarpenterPool(pool, "1")))
	nodes := waitForRunning(t, pool, "web", 3, 3*time.Minute)
	if len(nodes) != 1 {
		t.Fatalf("the three pods run on %v, want one node", nodes)
	}
	target := nodes[0]
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &n)
		return err == nil && slices.Contains(n.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer) &&
			slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer), err
	}, "Karpenter registered %s (its finalizer) and nodeguard guards it", target)
	harness.WaitForTerminationFinalizer(t, env.Client, target)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		states := m.states(target)
		return len(states) == 2 && states["kubernetes/kubernetes"] == "None" && states["kubernetes-internal/kubernetes"] == "None", nil
	}, "%s is in both load balancers' pools, None", target)
	pods := podNamesOn(t, pool, target)
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &node); err != nil {
		t.Fatal(err)
	}
	ref := karpenter.OwnerNodeClaim(&node)
	if ref == nil {
		t.Fatalf("node %s has no NodeClaim owner", target)
	}

	removeSlow := emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: "/backendAddressPools/", Delay: slowARMWrite})
	t.Cleanup(removeSlow)
	claim := &unstructured.Unstructured{}
	claim.SetGroupVersionKind(nodeClaimGVK)
	claim.SetName(ref.Name)
	deleted := time.Now()
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatalf("deleting NodeClaim %s: %v", ref.Name, err)
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, target)
	}, "Karpenter drains %s and deletes its instance", target)
	removeSlow()

	// Down: the first moment the history shows both entries Down.
	var downAt time.Time
	for _, w := range emu.History() {
		if !w.Time.IsZero() && allDownIn(statesAt(emu, target, w.Time)) {
			downAt = w.Time
			break
		}
	}
	if downAt.IsZero() {
		t.Fatalf("%s's entries were never all Down", target)
	}
	var early, refused, admitted int
	evicted := map[string]bool{}
	for _, e := range kpProxy.Evictions(pool) {
		if !pods[e.Pod] {
			continue
		}
		if e.Start.Before(downAt) {
			early++
		}
		if e.Status == http.StatusTooManyRequests {
			refused++
		}
		if e.Status >= 300 {
			if e.Start.Before(downAt) && e.Status != http.StatusTooManyRequests {
				t.Errorf("the eviction of %s before the cut was answered %d, want 429 (retry)", e.Pod, e.Status)
			}
			continue
		}
		admitted++
		evicted[e.Pod] = true
		if states := statesAt(emu, target, e.Start); !allDownIn(states) {
			t.Errorf("the eviction of %s, admitted (%d), started %s after the NodeClaim's deletion while %s's entries were %v, want all Down",
				e.Pod, e.Status, e.Start.Sub(deleted).Round(time.Millisecond), target, states)
		}
	}
	t.Logf("entries Down %s after the NodeClaim's deletion; Karpenter's eviction requests of its pods: %d before that, %d answered 429, %d admitted",
		downAt.Sub(deleted).Round(time.Millisecond), early, refused, admitted)
	if early == 0 {
		t.Errorf("Karpenter sent no eviction before the entries were Down: the test did not exercise the wait")
	}
	for p := range pods {
		if !evicted[p] {
			t.Errorf("pod %s of %s was never evicted through the proxy", p, target)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.notDown {
		t.Errorf("instance gone while an entry was not Down: %s", d)
	}
}

// allDownIn reports whether states (statesAt) are the two load balancers'
// entries, both Down.
func allDownIn(states []string) bool {
	return len(states) == 2 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=Down") })
}
