package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// karpenterEmulator starts an ARM emulator with the AKS load balancers and
// no node yet: cloudNodeManager adds Karpenter's nodes as they come.
func karpenterEmulator(t *testing.T) *armemulator.Server {
	t.Helper()
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, nil, armemulator.Topology{Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	return emu
}

// TestKarpenterNodeDeleteFollowsTheBudget: Karpenter puts its termination
// finalizer on every node it registers, so the finalizer does not mean
// Karpenter terminates the node. A kubectl delete node of a registered
// Karpenter node (its NodeClaim not deleting) is a delete like any other: refused
// while its budget allows nothing, admitted once it allows one, and then
// cut by nodeguard and drained and removed by Karpenter.
func TestKarpenterNodeDeleteFollowsTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	harness.InstallKarpenterCRDs(t, env.Client)
	pool := freshName("karpenter-delete")
	emu := karpenterEmulator(t)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	harness.MustCreate(t, env.Client, builder.NDB(pool, builder.NDBSelecting("karpenter.sh/nodepool", pool), builder.NDBMaxUnavailable("0")))
	startNodeguard(t, env.Kubeconfig, emu)
	m := &cloudNodeManager{emulator: emu, pool: pool, ips: map[string]string{}}
	m.run(t)
	harness.StartKarpenter(t, env.Kubeconfig)
	karpenterPool(t, pool)
	t.Cleanup(func() { removeKarpenterPool(t, pool) })

	harness.MustCreate(t, env.Client, builder.Deployment(pool, "web", 1, onKarpenterPool(pool, "3")))
	node := waitForRunning(t, pool, "web", 1, 3*time.Minute)[0]
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
		return err == nil && slices.Contains(n.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer) &&
			slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer), err
	}, "Karpenter registered %s (its finalizer) and nodeguard guards it", node)
	harness.WaitForTerminationFinalizer(t, env.Client, node) // past the hold, if nodeguard added its finalizer after the create

	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", node, "--wait=false")
	if err == nil || !strings.Contains(out, `NodeDisruptionBudget "`+pool+`" allows no`) {
		t.Fatalf("kubectl delete node %s (a registered Karpenter node) under a budget that allows nothing: %v, want refused by the budget:\n%s", node, err, out)
	}
	t.Logf("kubectl delete node %s: %s", node, strings.TrimSpace(out))
	if deleting, err := nodeDeleting(context.Background(), node); err != nil || deleting {
		t.Fatalf("node %s deleting after the refused delete: %v, %v", node, deleting, err)
	}

	setMaxUnavailable(t, pool, 1)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		_, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", node, "--wait=false")
		return err == nil, nil
	}, "kubectl delete node %s is admitted once the budget allows one", node)
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, node)
	}, "Karpenter drains %s and deletes its instance", node)
	harness.WaitForEvent(t, env.Client, node, "ReleasedToKarpenter")
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.notDown {
		t.Errorf("instance gone while an entry was not Down: %s", d)
	}
}

// TestKarpenterStrandedCandidatesServeAgain: Karpenter deletes the NodeClaims
// of three empty nodes (emptiness; its own budget allows all three), in one
// command or the dearest node alone first. nodeguard admits the dearest
// node's (no budget covers it) and denies the other two (a budget that allows
// none of them). Karpenter v1.14.1
// retries the command through its first candidate's NodeClaim, which it
// chooses: if that is the admitted one, it stops retrying once it is gone and
// leaves the other two tainted karpenter.sh/disrupted (their traffic cut)
// until it restarts; if it is a denied one, it retries every second for 10
// minutes. Either way nodeguard removes the taint 30 s after the first
// denial: the nodes serve again (entries None), with a Warning event naming
// the budget that denied them.
func TestKarpenterStrandedCandidatesServeAgain(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const small, big = karpenterInstanceType, "c-8x-amd64-linux"
	harness.InstallKarpenterCRDs(t, env.Client)
	pool := freshName("karpenter-multi")
	emu := karpenterEmulator(t)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	harness.MustCreate(t, env.Client, builder.NDB(pool,
		builder.NDBSelecting("karpenter.sh/nodepool", pool, corev1.LabelInstanceTypeStable, small), builder.NDBMaxUnavailable("0")))
	kpProxy := startAPIProxy(t)
	startNodeguard(t, env.Kubeconfig, emu)
	m := &cloudNodeManager{emulator: emu, pool: pool, ips: map[string]string{}}
	m.run(t)
	harness.StartKarpenter(t, kpProxy.Kubeconfig)
	// Karpenter's budget allows nothing until the three nodes are empty, so
	// that one command takes them all.
	karpenterPool(t, pool, func(s *nodePoolSpec) { s.instanceTypes, s.nodes = []string{small, big}, "0" })
	t.Cleanup(func() { removeKarpenterPool(t, pool) })

	// One pod per node: a c-8x node and two c-4x nodes. The big pod runs
	// before the small ones exist: created together, kube-scheduler may put a
	// small pod on the c-8x node Karpenter launched for the big one, which
	// then gets a second c-8x.
	harness.MustCreate(t, env.Client, builder.Deployment(pool, "big", 1, onKarpenterPool(pool, "7"), oneNodeEach(pool)))
	bigNode := waitForRunning(t, pool, "big", 1, 3*time.Minute)[0]
	harness.MustCreate(t, env.Client, builder.Deployment(pool, "small", 2, onKarpenterPool(pool, "3"), oneNodeEach(pool)))
	smallNodes := waitForRunning(t, pool, "small", 2, 3*time.Minute)
	if got := instanceTypes(t, append([]string{bigNode}, smallNodes...)); !slices.Equal(got, []string{big, small, small}) {
		t.Fatalf("Karpenter launched %v for the pods, want %v", got, []string{big, small, small})
	}
	scale(t, pool, "big", 0)
	scale(t, pool, "small", 0)
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return consolidatableNodeClaims(ctx, pool)
	}, "the three NodeClaims are consolidatable")
	setKarpenterBudget(t, pool, "100%")

	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, bigNode)
	}, "Karpenter removes %s, which no budget covers", bigNode)
	// Karpenter batches as it sees fit (one command of three, or the big node
	// alone first): wait until both small nodes' deletes were denied.
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, n := range smallNodes {
			if denials, err := harness.CountEvents(ctx, env.Client, n, "NodeClaimDeletionDenied"); err != nil || denials == 0 {
				return false, err
			}
		}
		return true, nil
	}, "Karpenter's NodeClaim deletes of %v are denied", smallNodes)
	if len(deniedNodeClaimDeletes(kpProxy)) < 2 {
		t.Fatalf("Karpenter's NodeClaim deletes denied: %v, want those of %v", deniedNodeClaimDeletes(kpProxy), smallNodes)
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, n := range smallNodes {
			if serving, err := servingAgain(ctx, m, n); err != nil || !serving {
				return false, err
			}
		}
		return true, nil
	}, "the denied nodes %v serve again: not deleting, no %s taint, entries None", smallNodes, ngv1alpha1.KarpenterDisruptedTaintKey)
	for _, n := range smallNodes {
		notes, err := harness.EventNotes(context.Background(), env.Client, n, "KarpenterDisruptionAbandoned")
		if err != nil || len(notes) != 1 || !strings.Contains(notes[0], `NodeDisruptionBudget "`+pool+`" denied`) {
			t.Errorf("KarpenterDisruptionAbandoned events of %s: %q (%v), want one naming the budget", n, notes, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.notDown {
		t.Errorf("instance gone while an entry was not Down: %s", d)
	}
}

// oneNodeEach keeps the pods of every Deployment with this option on nodes of
// their own.
func oneNodeEach(pool string) builder.WorkloadOption {
	return func(d *appsv1.Deployment) {
		d.Spec.Template.Labels["one-node-each"] = pool
		d.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"one-node-each": pool}},
				TopologyKey:   corev1.LabelHostname,
			}},
		}}
	}
}

// instanceTypes returns the nodes' instance types, in order.
func instanceTypes(t *testing.T, nodes []string) []string {
	t.Helper()
	var out []string
	for _, name := range nodes {
		var n corev1.Node
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n.Labels[corev1.LabelInstanceTypeStable])
	}
	return out
}

// consolidatableNodeClaims reports whether every NodeClaim of the pool is
// Consolidatable (empty or underused for the NodePool's consolidateAfter).
func consolidatableNodeClaims(ctx context.Context, pool string) (bool, error) {
	claims := &unstructured.UnstructuredList{}
	claims.SetGroupVersionKind(nodeClaimGVK.GroupVersion().WithKind("NodeClaimList"))
	if err := env.Client.List(ctx, claims, client.MatchingLabels{"karpenter.sh/nodepool": pool}); err != nil || len(claims.Items) == 0 {
		return false, err
	}
	for _, c := range claims.Items {
		conditions, _, _ := unstructured.NestedSlice(c.Object, "status", "conditions")
		if !slices.ContainsFunc(conditions, func(c any) bool {
			cond, _ := c.(map[string]any)
			return cond["type"] == "Consolidatable" && cond["status"] == "True"
		}) {
			return false, nil
		}
	}
	return true, nil
}

// servingAgain reports whether the node is in service: not deleting, without
// Karpenter's disrupted taint, and its load-balancer entries None.
func servingAgain(ctx context.Context, m *cloudNodeManager, name string) (bool, error) {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return false, err
	}
	if n.DeletionTimestamp != nil || n.Spec.Unschedulable || slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == ngv1alpha1.KarpenterDisruptedTaintKey
	}) {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	states := m.states(name)
	return len(states) == 2 && states["kubernetes/kubernetes"] == "None" && states["kubernetes-internal/kubernetes"] == "None", nil
}

// nodeDeleting reports whether the node has a deletion timestamp.
func nodeDeleting(ctx context.Context, name string) (bool, error) {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return false, err
	}
	return n.DeletionTimestamp != nil, nil
}
