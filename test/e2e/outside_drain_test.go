package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// kubectlDrain drains the node as an administrator does, through kubeconfig.
func kubectlDrain(kubeconfig, node string, timeout time.Duration) (string, error) {
	return harness.Kubectl(kubeconfig, "", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
		fmt.Sprintf("--timeout=%s", timeout))
}

// chargedLog watches the pool's nodes and keeps the most that ever carried
// nodeguard's drain mark at once, and the nodes that did.
type chargedLog struct {
	mu      sync.Mutex
	now     map[string]bool
	most    int
	charged map[string]bool
}

func watchCharged(t *testing.T, pool string) *chargedLog {
	t.Helper()
	l := &chargedLog{now: map[string]bool{}, charged: map[string]bool{}}
	startWatch(t, &corev1.NodeList{}, []client.ListOption{client.MatchingLabels{"pool": pool}}, func(typ watch.EventType, obj client.Object) {
		node := obj.(*corev1.Node)
		_, charged := ngv1alpha1.DrainCharged(node)
		l.mu.Lock()
		defer l.mu.Unlock()
		if typ == watch.Deleted || !charged {
			delete(l.now, node.Name)
			return
		}
		l.now[node.Name], l.charged[node.Name] = true, true
		l.most = max(l.most, len(l.now))
	}, nil)
	return l
}

func (l *chargedLog) seen(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.charged[node]
}

// TestKubectlDrainsAreCutAndTakeTurns drains two nodes of one
// NodeDisruptionBudget (maxUnavailable 1) with the real kubectl drain, the
// second while the first is out. The first node's load-balancer entries are
// all Down before its first eviction is forwarded; the second drain's
// evictions are refused with 429 naming the budget (kubectl retries them) and
// not one succeeds until the first node is uncordoned; the first node's
// entries are None again right after kubectl uncordon; then the second drain
// goes through.
func TestKubectlDrainsAreCutAndTakeTurns(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	top := newTopology(t, "kdrain", false)
	second := top.spares[0]
	patchNodeLabels(t, second, "kdrain-second", "true")
	harness.MustCreate(t, env.Client, builder.Deployment(top.ns, "second", 2, builder.OnNodes("kdrain-second", "true")))
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, second)
		running := 0
		for _, p := range pods {
			if p.Labels["app"] == "second" && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 2, err
	}, "the Deployment second runs its 2 pods on %s", second)
	harness.MustCreate(t, env.Client, builder.NDB(top.ns, builder.NDBSelecting("pool", top.ns), builder.NDBMaxUnavailable("1")))
	proxy := startAPIProxy(t)
	targetPods := podNamesOn(t, top.ns, top.target)
	startNodeguard(t, env.Kubeconfig, top.emulator)
	charged := watchCharged(t, top.ns)
	t.Cleanup(func() {
		for _, n := range []string{top.target, second} {
			_, _ = harness.Kubectl(env.Kubeconfig, "", "uncordon", n)
		}
	})
	waitForBudgetAllowed(t, top.ns, 1)

	first := make(chan error, 1)
	var firstOut string
	go func() {
		out, err := kubectlDrain(proxy.Kubeconfig, top.target, 4*time.Minute)
		firstOut = out
		first <- err
	}()
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) { return charged.seen(top.target), nil },
		"the first eviction from %s charged its drain", top.target)

	out, err := kubectlDrain(proxy.Kubeconfig, second, 15*time.Second)
	if err == nil || !strings.Contains(out, `NodeDisruptionBudget "`+top.ns+`" allows no more disruptions now`) ||
		!strings.Contains(out, top.target+" (drained by") {
		t.Fatalf("kubectl drain %s while %s is out: want its evictions refused naming the budget and %s, got %v:\n%s", second, top.target, top.target, err, out)
	}
	if err := <-first; err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", top.target, err, firstOut)
	}
	firstEvicted := firstEvictedOf(proxy.Evictions(top.ns), targetPods)
	if firstEvicted == nil {
		t.Fatalf("no pod of %s was evicted through the proxy", top.target)
	}
	down := top.targetStatesAt(firstEvicted.Start)
	if len(down) == 0 || slices.ContainsFunc(down, func(s string) bool { return !strings.HasSuffix(s, "=Down") }) {
		t.Fatalf("when the eviction of %s, the node's first, was sent its entries were %v, want every one Down", firstEvicted.Pod, down)
	}
	harness.WaitForEvent(t, env.Client, top.target, "DrainCharged")
	harness.WaitForEvent(t, env.Client, second, "DrainDenied")

	uncordoned := time.Now()
	harness.MustKubectl(t, env.Kubeconfig, "", "uncordon", top.target)
	harness.Eventually(t, 20*time.Second, func(context.Context) (bool, error) {
		states := top.targetStates()
		return len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=None") }), nil
	}, "every entry of %s is None again after kubectl uncordon", top.target)
	t.Logf("entries None %s after kubectl uncordon", time.Since(uncordoned).Round(time.Millisecond))
	for _, e := range proxy.Evictions(top.ns) {
		if strings.HasPrefix(e.Pod, "second-") && e.Status < 300 && e.Start.Before(uncordoned) {
			t.Errorf("pod %s on %s was evicted at %s, while %s was still out", e.Pod, second, e.Start.Format(time.RFC3339Nano), top.target)
		}
	}
	harness.WaitForEvent(t, env.Client, top.target, "DrainEnded")

	if out, err := kubectlDrain(proxy.Kubeconfig, second, 2*time.Minute); err != nil {
		t.Fatalf("kubectl drain %s once %s is back: %v\n%s", second, top.target, err, out)
	}
	if !charged.seen(second) {
		t.Error("the second drain was never charged")
	}
	if charged.most > 1 {
		t.Errorf("%d nodes of a budget of one disruption were charged drains at once", charged.most)
	}
	harness.MustKubectl(t, env.Kubeconfig, "", "uncordon", second)
	waitForBudgetAllowed(t, top.ns, 1)
}

// TestDrainWhileNodeguardIsDownIsPickedUp: with nodeguard stopped, a kubectl
// drain's evictions still go through (the eviction webhook fails open). Once
// nodeguard is back, the node still cordoned and draining is charged to its
// budget and its entries set Down within one resync, and kubectl uncordon
// gives it back.
func TestDrainWhileNodeguardIsDownIsPickedUp(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	top := newTopology(t, "downdrain", false)
	harness.MustCreate(t, env.Client, builder.NDB(top.ns, builder.NDBSelecting("pool", top.ns), builder.NDBMaxUnavailable("1")))
	proxy := startAPIProxy(t)
	targetPods := podNamesOn(t, top.ns, top.target)
	ng := startNodeguard(t, env.Kubeconfig, top.emulator)
	waitForBudgetAllowed(t, top.ns, 1)
	if err := ng.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = harness.Kubectl(env.Kubeconfig, "", "uncordon", top.target) })

	drained := make(chan error, 1)
	var drainOut string
	go func() {
		out, err := kubectlDrain(proxy.Kubeconfig, top.target, 4*time.Minute)
		drainOut = out
		drained <- err
	}()
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return firstEvictedOf(proxy.Evictions(top.ns), targetPods) != nil, nil
	}, "an eviction of the drain went through while nodeguard was down")

	restarted := time.Now()
	startNodeguard(t, env.Kubeconfig, top.emulator)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &node); err != nil {
			return false, err
		}
		_, charged := ngv1alpha1.DrainCharged(&node)
		states := top.targetStates()
		return charged && len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=Down") }), nil
	}, "the drain under way on %s is charged and its entries Down after nodeguard restarted", top.target)
	t.Logf("charged and Down %s after nodeguard restarted", time.Since(restarted).Round(time.Millisecond))
	waitForBudgetAllowed(t, top.ns, 0)

	if err := <-drained; err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", top.target, err, drainOut)
	}
	harness.MustKubectl(t, env.Kubeconfig, "", "uncordon", top.target)
	waitForBudgetAllowed(t, top.ns, 1)
	harness.Eventually(t, 20*time.Second, func(context.Context) (bool, error) {
		states := top.targetStates()
		return !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=None") }), nil
	}, "every entry of %s is None again after kubectl uncordon", top.target)
}

// podNamesOn lists the names of the pods on the node.
func podNamesOn(t *testing.T, ns, node string) map[string]bool {
	t.Helper()
	pods, err := evictablePodsOn(context.Background(), ns, node)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	return names
}

// firstEvictedOf is the first eviction (by its start) that evicted one of pods.
func firstEvictedOf(evictions []harness.Eviction, pods map[string]bool) *harness.Eviction {
	var first *harness.Eviction
	for i, e := range evictions {
		if pods[e.Pod] && e.Status < 300 && (first == nil || e.Start.Before(first.Start)) {
			first = &evictions[i]
		}
	}
	return first
}

// targetStatesAt replays the emulator's history of pool writes up to at: the
// target node's entries' admin states then, by "lb/pool".
func (top *topology) targetStatesAt(at time.Time) []string {
	last := map[string]armemulator.PoolWrite{}
	for _, w := range top.emulator.History() {
		if w.Pool != "aksOutboundBackendPool" && !w.Time.After(at) {
			last[w.LoadBalancer+"/"+w.Pool] = w
		}
	}
	var states []string
	for _, key := range slices.Sorted(maps.Keys(last)) {
		for _, e := range last[key].Entries {
			if e.Name == top.target || e.IP == "" && strings.Contains(e.IPConfigID, "/virtualMachines/0/") {
				states = append(states, key+"="+e.AdminState)
			}
		}
	}
	return states
}

// patchNodeLabels adds a label to a node.
func patchNodeLabels(t *testing.T, name, key, value string) {
	t.Helper()
	var node corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &node); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Labels[key] = value
	if err := env.Client.Patch(context.Background(), &node, patch); err != nil {
		t.Fatal(err)
	}
}

// waitForBudgetAllowed waits until the budget's status allows n disruptions.
func waitForBudgetAllowed(t *testing.T, name string, n int32) {
	t.Helper()
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &ndb)
		return err == nil && ndb.Status.ObservedGeneration == ndb.Generation && ndb.Status.DisruptionsAllowed == n, err
	}, "NodeDisruptionBudget %s allows %d disruption(s)", name, n)
}

// TestKubectlDrainOfABlockedPDBIsReplacedFirst: kubectl drain of a node
// carrying the only replica of a Deployment under minAvailable: 1, which no
// eviction can ever pass. With --blocked-pdb-policy=replace nodeguard restarts
// the Deployment (a surge pod elsewhere), so kubectl's next retry succeeds and
// the drain completes, never with fewer than 1 Ready pod; with wait, the drain
// is held and the node's DrainInProgress condition says why.
func TestKubectlDrainOfABlockedPDBIsReplacedFirst(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	for _, policy := range []string{"replace", "wait"} {
		t.Run(policy, func(t *testing.T) {
			c := newReplaceCluster(t, "kreplace"+policy, 1, func(ns string) {
				harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 1, builder.OnNodes("pool", ns)))
				harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MinAvailable("1")))
			}, "--blocked-pdb-policy="+policy)
			target := c.targets[0]
			c.waitReadyOnTargets(t, "web", 1)
			ready := watchReady(t, c.ns, "web")
			t.Cleanup(func() { _, _ = harness.Kubectl(env.Kubeconfig, "", "uncordon", target) })

			if policy == "wait" {
				out, err := kubectlDrain(env.Kubeconfig, target, 30*time.Second)
				if err == nil {
					t.Fatalf("kubectl drain of a PDB blocked by design succeeded under policy wait:\n%s", out)
				}
				harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
					var node corev1.Node
					err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &node)
					for _, cond := range node.Status.Conditions {
						if cond.Type == corev1.NodeDrainInProgress && containsAll(cond.Message, "PDB "+c.ns+"/web", "blocked-pdb-policy wait") {
							return true, err
						}
					}
					return false, err
				}, "DrainInProgress on %s says the drain waits on the blocked PDB", target)
				if _, ok := deploymentOf(t, c.ns, "web").Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; ok {
					t.Error("policy wait restarted the Deployment")
				}
				return
			}
			if out, err := kubectlDrain(env.Kubeconfig, target, 3*time.Minute); err != nil {
				t.Fatalf("kubectl drain %s: %v\n%s", target, err, out)
			}
			fewest := ready.require(t, 1)
			if _, ok := deploymentOf(t, c.ns, "web").Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; !ok {
				t.Error("the Deployment was not restarted for the drain")
			}
			waitForEventNote(t, "web", "RestartedForDrain", target)
			t.Logf("drained; fewest Ready web pods at any moment: %d", fewest)
		})
	}
}
