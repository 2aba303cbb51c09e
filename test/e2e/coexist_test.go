package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
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

// revertBound is how long a leaving node's entry may be back at None after
// another writer put it there.
const revertBound = 15 * time.Second

// coexistPools are the IP-based pools cloud-provider-azure reconciles.
var coexistPools = [][2]string{{"kubernetes", "kubernetes"}, {"kubernetes-internal", "kubernetes"}}

// cloudProviderLoop runs the cloud-provider-azure actor's reconcile every
// second against the cluster's current nodes of a pool (clusterNodes), with,
// when lbWrites, a whole-LB write every fifth round (a Service re-sync),
// until stopped.
type cloudProviderLoop struct {
	actor    *armemulator.CloudProvider
	pool     string
	lbWrites bool
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	errs     []string
}

func startCloudProvider(t *testing.T, emu *armemulator.Server, pool string, lbWrites bool) *cloudProviderLoop {
	l := &cloudProviderLoop{actor: armemulator.NewCloudProvider(emu), pool: pool, lbWrites: lbWrites, stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	t.Cleanup(l.halt)
	return l
}

func (l *cloudProviderLoop) run() {
	defer close(l.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for round := 1; ; round++ {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l.reconcile(ctx, l.lbWrites && round%5 == 0)
		cancel()
	}
}

func (l *cloudProviderLoop) reconcile(ctx context.Context, lbWrite bool) {
	nodes, err := clusterNodes(ctx, l.pool)
	if err == nil {
		var snap *armemulator.Snapshot
		if snap, err = l.actor.Read(ctx); err == nil {
			for _, p := range coexistPools {
				if _, err = snap.EnsureHostsInPool(ctx, p[0], p[1], nodes); err != nil {
					break
				}
			}
		}
	}
	if err == nil && lbWrite {
		for _, p := range coexistPools {
			// A 412 is what the real one meets after any other write; it
			// refreshes its cache and writes again next time.
			_ = l.actor.UpdateLoadBalancer(ctx, p[0])
		}
	}
	if err != nil {
		l.mu.Lock()
		l.errs = append(l.errs, err.Error())
		l.mu.Unlock()
	}
}

func (l *cloudProviderLoop) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

// clusterNodes lists the pool's nodes as cloud-provider-azure's node set
// sees them: every node that exists, deleting or not, but those labelled
// node.kubernetes.io/exclude-from-external-load-balancers (as Karpenter
// labels a node it drains), which it takes out of its pools.
func clusterNodes(ctx context.Context, pool string) ([]armemulator.Node, error) {
	var list corev1.NodeList
	if err := env.Client.List(ctx, &list, client.MatchingLabels{"pool": pool}); err != nil {
		return nil, err
	}
	var out []armemulator.Node
	for _, n := range list.Items {
		if _, excluded := n.Labels[corev1.LabelNodeExcludeBalancers]; excluded {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				out = append(out, armemulator.Node{Name: n.Name, IPs: []string{a.Address}})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// revertSpan is the time a leaving node's entry spent back at None: from
// the write that put it there to the one that made it Down again (or
// removed it), and whether nodeguard made that write.
type revertSpan struct {
	pool, node  string
	from, to    time.Time
	byNodeguard bool
}

// revertDurations walks the emulator's history: for each leaving node's
// entry, every time a write put it to None after it had been Down, how long
// until a write made it Down again or removed it.
func revertDurations(history []armemulator.PoolWrite, leaving []string) (durations []time.Duration, open []string) {
	spans, open := revertSpans(history, leaving)
	for _, s := range spans {
		durations = append(durations, s.to.Sub(s.from))
	}
	return durations, open
}

func revertSpans(history []armemulator.PoolWrite, leaving []string) (spans []revertSpan, open []string) {
	type entryKey struct{ pool, name string }
	wasDown := map[entryKey]bool{}
	since := map[entryKey]time.Time{}
	closeAt := func(k entryKey, w armemulator.PoolWrite) {
		if from, reverted := since[k]; reverted {
			spans = append(spans, revertSpan{pool: k.pool, node: k.name, from: from, to: w.Time, byNodeguard: armemulator.ByNodeguard(w)})
			delete(since, k)
		}
	}
	for _, w := range history {
		pool := w.LoadBalancer + "/" + w.Pool
		present := map[string]string{}
		for _, e := range w.Entries {
			present[e.Name] = e.AdminState
		}
		for _, name := range leaving {
			k := entryKey{pool, name}
			state, ok := present[name]
			switch {
			case ok && state == "Down":
				closeAt(k, w)
				wasDown[k] = true
			case ok && wasDown[k]:
				if _, reverted := since[k]; !reverted {
					since[k] = w.Time
				}
			case !ok:
				closeAt(k, w)
			}
		}
	}
	for k := range since {
		open = append(open, k.pool+"/"+k.name)
	}
	return spans, open
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// nodeguard412s returns nodeguard's pool PUTs answered 412 that no other
// writer's change of the same load balancer explains: one applied between
// nodeguard's GET of the pool and its PUT.
func nodeguard412s(emu *armemulator.Server) []string {
	reqs := emu.Requests()
	hist := emu.History()
	var out []string
	for i, r := range reqs {
		if r.Method != http.MethodPut || r.IfMatch == "" || r.Status != http.StatusPreconditionFailed || armemulator.Kind(r.Path) != "backendAddressPool" {
			continue
		}
		var getAt time.Time
		for _, g := range reqs[:i] {
			if g.Method == http.MethodGet && strings.EqualFold(g.Path, r.Path) {
				getAt = g.Start
			}
		}
		lb := strings.Split(strings.Split(strings.ToLower(r.Path), "/loadbalancers/")[1], "/")[0]
		explained := slices.ContainsFunc(hist, func(w armemulator.PoolWrite) bool {
			return strings.EqualFold(w.LoadBalancer, lb) && !armemulator.ByNodeguard(w) && w.By != "seed" &&
				!w.Time.Before(getAt) && !w.Time.After(r.Time)
		})
		if !explained {
			out = append(out, fmt.Sprintf("%s at %s", r.Path, r.Time.Format(time.RFC3339Nano)))
		}
	}
	return out
}

// coexistFixture is what the coexistence tests share: the nodes of a fresh
// pool behind a public and an internal load balancer, the first of them held
// in their drain by a do-not-evict pod, and nodeguard running (metrics on
// metricsPort) against an emulator seeded with them (with opts), whose writes
// are asynchronous operations.
type coexistFixture struct {
	t           *testing.T
	name        string
	subnet      int
	added       int
	emu         *armemulator.Server
	metricsPort int
	leaving     []string
}

func newCoexistFixture(t *testing.T, prefix string, subnet, nodes, leaving int, opts armemulator.Options) *coexistFixture {
	t.Helper()
	f := &coexistFixture{t: t, name: freshName(prefix), subnet: subnet}
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.name}})
	var seed []armemulator.Node
	for i := range nodes {
		n, ip := f.addNode()
		seed = append(seed, armemulator.Node{Name: n, IPs: []string{ip}, ProviderID: vmssProviderID(i)})
		if i < leaving {
			f.leaving = append(f.leaving, n)
			// A do-not-evict pod holds the node in its drain until released.
			harness.MustCreate(t, env.Client, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.name, Name: "hold-" + n, Annotations: map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}},
				Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "example.com/hold"}}},
			})
		}
	}
	opts.Async, opts.AsyncPolls = true, 1
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, seed, armemulator.Topology{Internal: true}), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	f.emu = emu
	f.metricsPort = harness.FreePort(t)
	startNodeguard(t, env.Kubeconfig, emu, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", f.metricsPort), "--metrics-secure=false")
	for _, n := range f.leaving {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	return f
}

// addNode creates the pool's next node and returns its name and address.
// One created after the fixture is in no backend pool until another writer
// (cloud-provider-azure) adds it.
func (f *coexistFixture) addNode() (string, string) {
	i := f.added
	f.added++
	n := fmt.Sprintf("%s-%d", f.name, i)
	ip := fmt.Sprintf("10.%d.%d.%d", len(f.name), f.subnet, i+4)
	harness.MustCreate(f.t, env.Client, builder.Node(n, builder.WithLabels("pool", f.name), builder.WithProviderID(vmssProviderID(i)), builder.WithInternalIP(ip)))
	return n, ip
}

// inEveryPool reports whether the node has an entry in both pools.
func (f *coexistFixture) inEveryPool(node string) bool {
	states := f.emu.AdminStates()
	for _, p := range coexistPools {
		if _, ok := states[p[0]+"/"+p[1]+"/"+node]; !ok {
			return false
		}
	}
	return true
}

// allDown reports whether every leaving node's entry is Down in both pools.
func (f *coexistFixture) allDown() bool {
	states := f.emu.AdminStates()
	for _, p := range coexistPools {
		for _, n := range f.leaving {
			if states[p[0]+"/"+p[1]+"/"+n] != "Down" {
				return false
			}
		}
	}
	return true
}

// TestTrafficCutHoldsWhileCloudProviderReconciles: three nodes drain while
// the cloud-provider-azure actor reconciles the pools every second and two
// replacement nodes join. Twice, once the actor has added a replacement, a
// reconcile that read the load balancers before the cut PUTs a pool back (no
// If-Match), undoing the leaving nodes' Down. The entries are Down again within 15 s (p99 over the run): nodeguard
// sets them Down with a LoadBalancerAdminStateReverted event and the reverts
// counter, unless the actor's next reconcile, from a copy read before the
// stale PUT, did first; the entries the actor added (replacements) and removed (released
// nodes) stay as it wrote them, nodeguard's writes change admin state only,
// and none of its writes meets a 412 that no other writer caused.
func TestTrafficCutHoldsWhileCloudProviderReconciles(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	// The writers meet each other's operations: each waits a Retry-After
	// of 1 s (ARM says 10 s or so; this test is not about the wait).
	f := newCoexistFixture(t, "coexist", 1, 5, 3, armemulator.Options{BusyRetryAfter: time.Second})
	name, emu, metricsPort, leaving := f.name, f.emu, f.metricsPort, f.leaving
	loop := startCloudProvider(t, emu, name, true)
	stale := armemulator.NewCloudProvider(emu)
	before, err := stale.Read(ctx) // a reconcile that starts before the cut
	if err != nil {
		t.Fatal(err)
	}

	harness.MustKubectl(t, env.Kubeconfig, "", append([]string{"delete", "node", "--wait=false"}, leaving...)...)
	allDown := f.allDown
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) { return allDown(), nil }, "every leaving node is Down in both pools")

	// Two stale reconciles, each after a replacement node joins. The actor
	// adds the replacement first: until then its reconcile PUTs the pool from
	// a copy read before the stale PUT, which would undo the revert before
	// nodeguard could (and the test would not exercise nodeguard's undo).
	for _, p := range coexistPools {
		replacement, _ := f.addNode()
		harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) { return f.inEveryPool(replacement), nil },
			"the actor adds replacement %s to both pools", replacement)
		nodes, err := clusterNodes(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := before.EnsureHostsInPool(ctx, p[0], p[1], nodes); err != nil {
			t.Fatal(err)
		}
		t.Logf("stale PUT of %s/%s (read before the cut) with replacement %s", p[0], p[1], replacement)
		harness.Eventually(t, 2*revertBound, func(context.Context) (bool, error) { return allDown(), nil }, "the leaving nodes are Down again after the stale PUT of %s/%s", p[0], p[1])
	}
	// Every revert nodeguard undid (the actor's next reconcile, from a copy
	// read before the stale PUT, may undo one first) has its event naming
	// the pool and its count.
	spans, _ := revertSpans(emu.History(), leaving)
	undone := map[string]int{}
	for _, sp := range spans {
		if !sp.byNodeguard {
			continue
		}
		undone[sp.pool]++
		notes := eventNotes(ctx, t, sp.node, "LoadBalancerAdminStateReverted")
		if !slices.ContainsFunc(notes, func(s string) bool { return strings.Contains(s, "Backend pool "+sp.pool+":") }) {
			t.Errorf("%s: LoadBalancerAdminStateReverted events %q, want one naming the pool %s", sp.node, notes, sp.pool)
		}
	}
	if len(undone) == 0 {
		t.Errorf("nodeguard undid none of the reverts: the test did not exercise it")
	}
	for pool, n := range undone {
		if got := scrapeCounter(t, metricsPort, fmt.Sprintf(`loadbalancer_adminstate_reverts_total{pool=%q,state="Down"}`, pool)); got < float64(n) {
			t.Errorf("loadbalancer_adminstate_reverts_total{pool=%q,state=\"Down\"} = %v, want at least the %d reverts nodeguard undid", pool, got, n)
		}
	}

	// Released: the actor removes the nodes' entries; nodeguard leaves them out.
	var list corev1.PodList
	if err := env.Client.List(ctx, &list, client.InNamespace(name)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if err := env.Client.Delete(ctx, &list.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range leaving {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, n) }, "node %s is released", n)
	}
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		states := emu.AdminStates()
		for _, p := range coexistPools {
			for _, n := range leaving {
				if _, ok := states[p[0]+"/"+p[1]+"/"+n]; ok {
					return false, nil
				}
			}
		}
		return true, nil
	}, "the actor removed the released nodes' entries")
	// One more reconcile on the final node set, then stop.
	lists := loop.actor.Stats().Lists
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) { return loop.actor.Stats().Lists > lists+1, nil }, "the actor reconciles again")
	loop.halt()

	history := emu.History()
	durations, open := revertDurations(history, leaving)
	t.Logf("reverts undone in %v (p99 %s); actor %+v; actor errors %q", durations, p99(durations), loop.actor.Stats(), loop.errs)
	if len(durations) < 2*len(leaving) {
		t.Errorf("%d reverts seen in the history, want at least %d (the two stale PUTs)", len(durations), 2*len(leaving))
	}
	if got := p99(durations); got > revertBound {
		t.Errorf("p99 of a revert's duration = %s, want at most %s", got, revertBound)
	}
	if len(open) > 0 {
		t.Errorf("reverts never undone: %v", open)
	}
	if err := armemulator.OnlyAdminStateChanged(history, armemulator.ByNodeguard); err != nil {
		t.Errorf("a nodeguard write changed membership: %v", err)
	}
	final, err := clusterNodes(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	states := emu.AdminStates()
	for _, p := range coexistPools {
		for _, n := range final {
			if got := states[p[0]+"/"+p[1]+"/"+n.Name]; got != "None" {
				t.Errorf("%s/%s/%s = %q, want the entry the actor wrote, at None", p[0], p[1], n.Name, got)
			}
		}
		var entries int
		for k := range states {
			if strings.HasPrefix(k, p[0]+"/"+p[1]+"/") {
				entries++
			}
		}
		if entries != len(final) {
			t.Errorf("%s/%s holds %d entries, want the actor's %d", p[0], p[1], entries, len(final))
		}
	}
	if bad := nodeguard412s(emu); len(bad) > 0 {
		t.Errorf("nodeguard's writes met 412 with no other writer in between: %v", bad)
	}
}
