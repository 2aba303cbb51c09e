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
