package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// targetStates returns the target node's entries' admin states in the emulator.
func (top *topology) targetStates() []string {
	var states []string
	for _, p := range top.emulator.State() {
		if p.Pool == "aksOutboundBackendPool" {
			continue
		}
		for _, e := range p.Entries {
			if e.Name == top.target || e.IP == "" && strings.Contains(e.IPConfigID, "/virtualMachines/0/") {
				states = append(states, p.LoadBalancer+"/"+p.Pool+"="+e.AdminState)
			}
		}
	}
	return states
}

// TestDeleteNodeCutsTrafficThenDrainsWithinBudgets deletes a node carrying
// three PDB-protected Deployments, unprotected pods, a DaemonSet pod, a mirror
// pod, a completed pod and a do-not-evict pod with kubectl, under a
// NodeDisruptionBudget of maxUnavailable 1, and checks what the user relies
// on. make test-oldest runs it on Kubernetes 1.36 too: it is the core path,
// through admission, the Eviction API, and the controller manager's
// disruption controller and garbage collector.
func TestDeleteNodeCutsTrafficThenDrainsWithinBudgets(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	top := newTopology(t, "drain", true)
	harness.MustCreate(t, env.Client, builder.NDB(top.ns, builder.NDBSelecting("pool", top.ns), builder.NDBMaxUnavailable("1")))
	proxy := startAPIProxy(t)
	var downAtFirstEviction []string
	var once sync.Once
	proxy.OnFirstEviction(func() { once.Do(func() { downAtFirstEviction = top.targetStates() }) })
	startNodeguard(t, proxy.Kubeconfig, top.emulator)
	harness.WaitForTerminationFinalizer(t, env.Client, top.target)
	monitor := watchBudgets(t, top.ns)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: top.ns}, &ndb)
		return err == nil && ndb.Status.ObservedGeneration == ndb.Generation && ndb.Status.DisruptionsAllowed == 1, err
	}, "nodeguard evaluated the budget: 1 disruption allowed")

	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", top.target, "--wait=false")

	t.Cleanup(func() {
		if t.Failed() {
			for _, b := range budgets {
				var pdb policyv1.PodDisruptionBudget
				_ = env.Client.Get(ctx, client.ObjectKey{Namespace: top.ns, Name: b.app}, &pdb)
				t.Logf("PDB %s status %+v; eviction answers %v", b.app, pdb.Status, proxy.Answers(top.ns, b.app))
			}
		}
	})
	// Everything goes but the do-not-evict pod and the DaemonSet pod, which goes
	// last; the node stays for them.
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, top.target)
		var apps []string
		for _, p := range pods {
			apps = append(apps, p.Labels["app"])
		}
		slices.Sort(apps)
		return err == nil && slices.Equal(apps, []string{"daemon", "keep"}), err
	}, "only the do-not-evict pod and the DaemonSet pod are left on the node")
	if gone, _ := harness.NodeGone(ctx, env.Client, top.target); gone {
		t.Fatal("the node was released while a do-not-evict pod was still on it")
	}
	harness.WaitForEvent(t, env.Client, top.target, "DoNotEvictPodBlocking")
	// kubectl describe node says why the node is still there.
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		c, err := nodeCondition(ctx, top.target)
		return c != nil && c.Reason == "Draining" && strings.Contains(c.Message, "annotated nodeguard.io/do-not-evict=true"), err
	}, "node %s carries the %s condition naming the do-not-evict pod", top.target, ngv1alpha1.TerminatingCondition)
	var draining corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &draining); err != nil || !slices.ContainsFunc(draining.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == corev1.NodeDrainInProgress && c.Status == corev1.ConditionTrue
	}) {
		t.Errorf("during the drain the node should carry DrainInProgress=True (KEP-5683): %+v (%v)", draining.Status.Conditions, err)
	}
	// The draining node uses up the pool's budget: a second delete is refused.
	// nodeguard added its finalizer to the spare when it started, as to the
	// target: until that mark's hold has passed, a delete is told to retry.
	harness.WaitForTerminationFinalizer(t, env.Client, top.spares[0])
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", top.spares[0], "--wait=false"); err == nil || !strings.Contains(out, `NodeDisruptionBudget "`+top.ns+`" allows no`) {
		t.Errorf("kubectl delete node %s while %s drains under maxUnavailable 1: %v, want refused by the budget:\n%s", top.spares[0], top.target, err, out)
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: top.target}, &lease); err != nil ||
		!strings.HasPrefix(ptr.Deref(lease.Spec.HolderIdentity, ""), "nodeguard/") || ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) == 0 {
		t.Errorf("during the drain the maintenance Lease should be held by nodeguard: %+v (%v)", lease.Spec, err)
	}

	top.releaseHeld(ctx, t)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: top.ns}, &ndb)
		return err == nil && len(ndb.Status.DisruptedNodes) == 0, err
	}, "the budget no longer charges the released node")

	monitor.check(t)
	for _, b := range budgets {
		if got := proxy.MaxInFlight(top.ns, b.app); got != 1 {
			t.Errorf("%s: at most %d eviction requests in flight at once, want exactly 1", b.app, got)
		}
	}
	if answers := proxy.Answers(top.ns, "two"); len(answers) < 2 || answers[0] != http.StatusCreated || answers[1] != http.StatusCreated {
		t.Errorf("under maxUnavailable 2 the first two evictions should both succeed back to back, got %v", answers)
	}
	if len(downAtFirstEviction) == 0 {
		t.Error("the target node has no load-balancer entries in the emulator")
	}
	for _, s := range downAtFirstEviction {
		if !strings.HasSuffix(s, "=Down") {
			t.Errorf("at the first eviction the node's entries were %v, want every one Down", downAtFirstEviction)
			break
		}
	}
	waitLeaseGone(t, top.target)
}
