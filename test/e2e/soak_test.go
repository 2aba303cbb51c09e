package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The chaos soak runs nodeguard as installed for production, two replicas with
// leader election behind one webhook Service, and deletes rounds of 6 nodes
// under a NodeDisruptionBudget while their pods are under PodDisruptionBudgets.
// Meanwhile a driver SIGKILLs the leader at random moments (it comes back a
// few seconds later) and injects ARM faults: 429 with Retry-After, 412, 500
// past the SDK's retries, calls that hang past --azure-request-timeout, and
// connections refused. Then it checks what a user relies on, from watches
// that see every change:
//
//   - every node deleted is released;
//   - no PodDisruptionBudget ever had fewer healthy pods than it requires;
//   - no NodeDisruptionBudget ever had more nodes unavailable than it allows;
//   - no maintenance Lease outlives its node, and the stopped replicas hold no
//     leader election Lease;
//   - the backend entries of released nodes and of the nodes that stay are in
//     the state they should be (see checkEntries);
//   - nodeguard's ARM calls stay within armCallBound.
//
// make test runs the short version (one round, a few kills, every fault
// class); make soak runs it for NODEGUARD_SOAK (20m), with at least 20 kills,
// and prints the figures either way.

// soakEnv holds the full soak's duration; without it the short version runs.
const soakEnv = "NODEGUARD_SOAK"

// soakPlan says how long and how hard the soak runs.
type soakPlan struct {
	name string
	// duration: rounds start until this much time has passed, at least one
	// round, and until minKills leader kills and every fault class happened
	// (within maxRounds, the rounds whose nodes the load balancers hold).
	duration     time.Duration
	minKills     int
	maxRounds    int
	killEvery    [2]time.Duration
	faultEvery   [2]time.Duration
	roundTimeout time.Duration
}

func planSoak(t *testing.T) soakPlan {
	v := os.Getenv(soakEnv)
	if v == "" {
		return soakPlan{name: "short", minKills: 3, maxRounds: 3, killEvery: [2]time.Duration{10 * time.Second, 20 * time.Second},
			faultEvery: [2]time.Duration{2 * time.Second, 5 * time.Second}, roundTimeout: 6 * time.Minute}
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", soakEnv, v, err)
	}
	// A round takes about a minute here, never less than 20 s.
	rounds := int(d/(20*time.Second)) + 1
	return soakPlan{name: "full", duration: d, minKills: 20, maxRounds: rounds, killEvery: [2]time.Duration{20 * time.Second, 45 * time.Second},
		faultEvery: [2]time.Duration{4 * time.Second, 12 * time.Second}, roundTimeout: 10 * time.Minute}
}

const (
	soakLabel     = "soak"      // every node of a soak run: soak=<run>
	soakPoolLabel = "soak-pool" // "<run>-spare", or "<run>-round-<n>" for a round's targets
	soakTargets   = 6
	soakSpares    = 3
	// soakMaxUnavailable is each round's NodeDisruptionBudget.
	soakMaxUnavailable = 2
	soakLeaderLease    = "nodeguard-soak"
	// soakResync is --azure-admin-state-resync, and soakRequestTimeout
	// --azure-request-timeout: an injected hang lasts that long. It outlasts
	// the SDK's retries of a refused connection (0.8 s, 1.6 s, 3.2 s), so
	// that a call to an ARM endpoint that is down ends "connection refused".
	soakResync         = 20 * time.Second
	soakRequestTimeout = 10 * time.Second
)

// soakWorkloads are each round's protected workloads, and the healthy pods
// their PDBs require.
var soakWorkloads = []struct {
	app        string
	replicas   int32
	pdb        func(*policyv1.PodDisruptionBudgetSpec)
	minHealthy int
}{
	{"one", 6, builder.MaxUnavailable("1"), 5},
	{"two", 6, builder.MaxUnavailable("2"), 4},
	{"most", 8, builder.MinAvailable("75%"), 6},
}

// soak is the running install and what the rounds recorded.
type soak struct {
	// run prefixes every name: -count=N runs the soak N times on one cluster.
	run      string
	plan     soakPlan
	emu      *armemulator.Server
	front    *armemulator.Front
	replicas []*replica
	killer   *killer
	faults   *faultInjector
	spares   []string
	// entries are the backend entries the load balancers started with.
	entries []string

	mu       sync.Mutex
	released []string
	lowest   map[string]int // workload -> fewest healthy pods in any round
	most     int            // most round nodes unavailable at once
	denials  int            // deletes the NodeDisruptionBudget refused
	failed   int            // deletes that failed otherwise (webhook unreachable)
}

func TestChaosSoak(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	s := startSoak(t, planSoak(t))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.killer.run(ctx) }()
	go func() { defer wg.Done(); s.faults.run(ctx) }()
	defer func() { stop(); wg.Wait() }()

	start := time.Now()
	rounds := 0
	for rounds < s.plan.maxRounds && (rounds == 0 || s.more(start)) {
		rounds++
		if !t.Run(fmt.Sprintf("round %d", rounds), func(t *testing.T) { s.round(t, rounds) }) {
			break
		}
	}
	stop()
	wg.Wait()
	if t.Failed() {
		return
	}
	s.finish(t, rounds, time.Since(start))
}

// startSoak starts the spares, Azure and the two replicas.
func startSoak(t *testing.T, plan soakPlan) *soak {
	t.Helper()
	s := &soak{run: freshName("soak"), plan: plan, lowest: map[string]int{}}
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.system()}})
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.system()}})
	})
	var emuNodes []armemulator.Node
	for i := range soakSpares {
		name := fmt.Sprintf("%s-spare-%d", s.run, i)
		node := s.node(name, s.run+"-spare", 200+i, fmt.Sprintf("10.250.0.%d", 4+i), fmt.Sprintf("fd00:250::%d", 4+i))
		harness.MustCreate(t, env.Client, node)
		s.spares = append(s.spares, name)
		emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: internalIPs(node), ProviderID: node.Spec.ProviderID})
	}
	// The load balancers hold every round's nodes from the start, as
	// cloud-provider-azure adds a VM when it joins: nothing but nodeguard
	// writes the pools during the soak.
	for round := 1; round <= plan.maxRounds; round++ {
		for _, node := range s.targets(round) {
			emuNodes = append(emuNodes, armemulator.Node{Name: node.Name, IPs: internalIPs(node), ProviderID: node.Spec.ProviderID})
		}
	}
	// Dual stack, public and internal load balancers: two pools per load
	// balancer share its ETag. Writes are long-running operations.
	s.emu = armemulator.New(armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	for key := range s.emu.AdminStates() {
		s.entries = append(s.entries, key)
	}
	front, err := armemulator.StartFront(fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), s.emu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	s.front = front

	binary, err := harness.NodeguardBinary()
	if err != nil {
		t.Fatal(err)
	}
	common := append([]string{
		"--kubeconfig=" + env.NodeguardKubeconfig, "--health-probe-bind-address=0", "--node-selector=" + soakLabel + "=" + s.run,
		"--leader-elect=true", "--leader-election-namespace=" + s.system(), "--leader-election-id=" + soakLeaderLease,
		"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s",
		"--graceful-shutdown-timeout=15s", "--admin-state-timeout=20s", "--zap-log-level=debug",
		"--azure-request-timeout=" + soakRequestTimeout.String(), "--azure-admin-state-resync=" + soakResync.String(),
	}, harness.EmulatorArgs(front.URL(), subscription, resourceGroup)...)
	webhooks, err := harness.StartWebhookFront(env.WebhookAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(webhooks.Close)
	var addrs []string
	for _, name := range []string{"nodeguard-" + s.run + "-a", "nodeguard-" + s.run + "-b"} {
		r := newReplica(t, name, binary, common)
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
		s.replicas = append(s.replicas, r)
		addrs = append(addrs, r.webhookAddr())
	}
	webhooks.SetBackends(addrs...)
	s.killer = &killer{replicas: s.replicas, every: plan.killEvery}
	if s.killer.leader(context.Background(), leaderGap) == nil {
		t.Fatalf("no replica leads within %s", leaderGap)
	}
	s.faults = newFaultInjector(s.emu, front, plan.faultEvery, s.refusedCalls)
	for _, n := range s.spares {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	return s
}

// more reports whether another round is due.
func (s *soak) more(start time.Time) bool {
	kills, _ := s.killer.counts()
	_, hit := s.faults.counts()
	for _, c := range faultClasses {
		if hit[c] == 0 {
			return true
		}
	}
	return time.Since(start) < s.plan.duration || kills < s.plan.minKills
}

// refusedCalls counts the ARM calls nodeguard logged as refused (pool updates
// log their failures at debug level, which the replicas run at).
func (s *soak) refusedCalls() int {
	return countInLogs(s.replicas, strings.TrimPrefix(s.front.URL(), "http://"), "connection refused")
}

// system is the namespace of the leader election Lease.
func (s *soak) system() string { return s.run + "-system" }

// node is a node of this run in a pool.
func (s *soak) node(name, pool string, index int, ips ...string) *corev1.Node {
	opts := []builder.NodeOption{builder.WithLabels(soakLabel, s.run, soakPoolLabel, pool), builder.WithProviderID(vmssProviderID(index))}
	for _, ip := range ips {
		opts = append(opts, builder.WithInternalIP(ip))
	}
	return builder.Node(name, opts...)
}

func internalIPs(n *corev1.Node) []string {
	var ips []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ips = append(ips, a.Address)
		}
	}
	return ips
}

// round deletes 6 fresh nodes carrying protected pods, and checks the budgets
// held and every node was released.
func (s *soak) round(t *testing.T, round int) {
	ns := fmt.Sprintf("%s-%d", s.run, round)
	pool := fmt.Sprintf("%s-round-%d", s.run, round)
	targets := s.createTargets(t, round, pool)
	s.createWorkloads(t, ns, pool)

	minHealthy := map[string]int{}
	for _, w := range soakWorkloads {
		minHealthy[w.app] = w.minHealthy
	}
	pods := watchPodBudgets(t, ns, minHealthy)
	nodes := watchNodeBudget(t, pool, soakMaxUnavailable)
	nodes.arm()

	began := time.Now()
	denials, failed := deleteUntilAdmitted(t, targets, s.plan.roundTimeout)
	harness.Eventually(t, s.plan.roundTimeout, func(ctx context.Context) (bool, error) {
		for _, n := range targets {
			if gone, err := harness.NodeGone(ctx, env.Client, n); !gone || err != nil {
				return false, err
			}
		}
		return true, nil
	}, "every node of round %d is released", round)
	pods.check(t)
	nodes.check(t)
	for _, n := range targets {
		waitLeaseGone(t, n)
	}
	kills, _ := s.killer.counts()
	t.Logf("round %d: %d nodes released in %s; %d deletes refused by the NodeDisruptionBudget, %d failed otherwise; most nodes unavailable at once %d (budget %d); fewest healthy pods %v (PDBs require %v); %d leader kills so far",
		round, len(targets), time.Since(began).Round(time.Second), denials, failed, nodes.mostUnavailable(), soakMaxUnavailable, pods.lowestHealthy(), minHealthy, kills)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, targets...)
	s.denials += denials
	s.failed += failed
	s.most = max(s.most, nodes.mostUnavailable())
	for app, n := range pods.lowestHealthy() {
		if low, ok := s.lowest[app]; !ok || n < low {
			s.lowest[app] = n
		}
	}
}

// createTargets creates the round's nodes under a NodeDisruptionBudget
// allowing 2 unavailable.
func (s *soak) createTargets(t *testing.T, round int, pool string) []string {
	t.Helper()
	var names []string
	for _, n := range s.targets(round) {
		harness.MustCreate(t, env.Client, n)
		names = append(names, n.Name)
	}
	ndb := builder.NDB(pool, builder.NDBSelecting(soakPoolLabel, pool), builder.NDBMaxUnavailable(fmt.Sprint(soakMaxUnavailable)))
	harness.MustCreate(t, env.Client, ndb)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
	for _, n := range names {
		waitReadyWithFinalizer(t, n)
	}
	return names
}

// waitReadyWithFinalizer waits until kwok reports the node Ready and it
// carries the termination finalizer (a failover may delay the backfill).
func waitReadyWithFinalizer(t *testing.T, name string) {
	t.Helper()
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return false, err
		}
		_, justAdded := n.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
		return nodeReady(&n) && slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) && !justAdded, nil
	}, "node %s is Ready and carries the termination finalizer", name)
}

// targets are a round's nodes: dual stack, in their own pool.
func (s *soak) targets(round int) []*corev1.Node {
	var nodes []*corev1.Node
	for i := range soakTargets {
		name := fmt.Sprintf("%s-r%d-%d", s.run, round, i)
		nodes = append(nodes, s.node(name, fmt.Sprintf("%s-round-%d", s.run, round), 1000+round*10+i,
			fmt.Sprintf("10.251.%d.%d", round%250, 4+i), fmt.Sprintf("fd00:251:%x::%d", round, 4+i)))
	}
	return nodes
}

// createWorkloads puts the round's pods on its targets: the spares are
// cordoned until every pod runs there, so that evicted pods then move to
// them. Besides the protected workloads, pods under no PDB and a DaemonSet
// that tolerates every taint.
func (s *soak) createWorkloads(t *testing.T, ns, pool string) {
	t.Helper()
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	s.cordonSpares(t, true)
	onSoak := builder.OnNodes(soakLabel, s.run)
	for _, w := range soakWorkloads {
		harness.MustCreate(t, env.Client, builder.Deployment(ns, w.app, w.replicas, onSoak))
		harness.MustCreate(t, env.Client, builder.PDB(ns, w.app, w.pdb))
	}
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "free", 6, onSoak))
	harness.MustCreate(t, env.Client, tolerateAllDaemonSet(ns, s.run))
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		ready := map[string]int32{}
		for _, p := range pods.Items {
			if harness.PodReady(&p) && strings.HasPrefix(p.Spec.NodeName, s.run+"-r") {
				ready[p.Labels["app"]]++
			}
		}
		for _, w := range soakWorkloads {
			if ready[w.app] != w.replicas {
				return false, nil
			}
		}
		return ready["free"] == 6, nil
	}, "the pods of %s run on its nodes", pool)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		for _, w := range soakWorkloads {
			var pdb policyv1.PodDisruptionBudget
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.app}, &pdb); err != nil || pdb.Status.CurrentHealthy != w.replicas {
				return false, err
			}
		}
		return true, nil
	}, "every PDB of %s counts its pods healthy", ns)
	s.cordonSpares(t, false)
}

func (s *soak) cordonSpares(t *testing.T, cordon bool) {
	t.Helper()
	for _, n := range s.spares {
		if err := setUnschedulable(context.Background(), n, cordon); err != nil {
			t.Fatal(err)
		}
	}
}

// tolerateAllDaemonSet is a node agent like kube-proxy or a log shipper: on
// every soak node, tolerating every taint.
func tolerateAllDaemonSet(ns, run string) *appsv1.DaemonSet {
	ds := daemonSet(ns)
	ds.Spec.Template.Spec.NodeSelector = map[string]string{soakLabel: run}
	ds.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	return ds
}

// deleteUntilAdmitted deletes every node, retrying those refused (by the
// NodeDisruptionBudget, or while no webhook answered) every second, as a
// cluster autoscaler would, until each is admitted. It returns how many
// deletes were refused by the budget and how many failed otherwise.
func deleteUntilAdmitted(t *testing.T, nodes []string, timeout time.Duration) (denials, failed int) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(timeout)
	var stuck []string
	for _, name := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
				if err == nil || apierrors.IsNotFound(err) {
					return
				}
				mu.Lock()
				if apierrors.IsTooManyRequests(err) && strings.Contains(err.Error(), "NodeDisruptionBudget") {
					denials++
				} else {
					failed++
				}
				mu.Unlock()
				time.Sleep(time.Second)
			}
			mu.Lock()
			stuck = append(stuck, name)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(stuck) > 0 {
		t.Fatalf("deletes of %v never admitted within %s", stuck, timeout)
	}
	return denials, failed
}

// finish checks what the whole soak must leave behind and prints its figures.
func (s *soak) finish(t *testing.T, rounds int, elapsed time.Duration) {
	t.Helper()
	for _, r := range s.replicas {
		if !r.running() {
			if err := r.start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.killer.leader(context.Background(), leaderGap) == nil {
		t.Fatalf("no replica leads %s after the last kill", leaderGap)
	}
	kills, killFailures := s.killer.counts()
	for _, f := range killFailures {
		t.Errorf("leader kills: %s", f)
	}
	injected, hit := s.faults.counts()
	for _, c := range faultClasses {
		if hit[c] == 0 {
			t.Errorf("fault class %q never hit an ARM call (%d injected)", c, injected[c])
		}
	}
	if kills < s.plan.minKills {
		t.Errorf("%d leader kills, want at least %d", kills, s.plan.minKills)
	}
	entries := s.checkEntries(t)
	calls, bound := s.checkARMCalls(t, hit, elapsed)
	leases := s.checkLeases(t)

	s.mu.Lock()
	defer s.mu.Unlock()
	var faults []string
	for _, c := range faultClasses {
		faults = append(faults, fmt.Sprintf("%s: %d injected, %d calls hit", c, injected[c], hit[c]))
	}
	t.Logf(`chaos soak (%s) figures:
  duration                  %s, %d rounds
  nodes released            %d of %d deleted
  leader kills (SIGKILL)    %d; replica starts %d
  ARM faults                %s
  deletes refused           %d by the NodeDisruptionBudget, %d otherwise (webhook unreachable)
  fewest healthy pods       %v (PDBs require %v): never below
  most nodes unavailable    %d at once (NodeDisruptionBudget maxUnavailable %d): never above
  backend entries           %s
  ARM calls                 %s (bound %d)
  Leases                    %s`,
		s.plan.name, elapsed.Round(time.Second), rounds, len(s.released), rounds*soakTargets, kills, s.starts(),
		strings.Join(faults, "; "), s.denials, s.failed, s.lowest, soakRequired(), s.most, soakMaxUnavailable,
		entries, calls, bound, leases)
}

func soakRequired() map[string]int {
	m := map[string]int{}
	for _, w := range soakWorkloads {
		m[w.app] = w.minHealthy
	}
	return m
}

func (s *soak) starts() int {
	n := 0
	for _, r := range s.replicas {
		r.mu.Lock()
		n += r.starts
		r.mu.Unlock()
	}
	return n
}

// cutConfirmedOutcome is the outcome of a cut that NodeReleased says was
// confirmed.
const cutConfirmedOutcome = "confirmed"

// cutOutcome says how a released node's cut ended: the Warning event of a cut
// not confirmed, else whether its NodeReleased event says it was confirmed.
func cutOutcome(node string) (string, error) {
	for _, reason := range []string{finalizer.ReasonTrafficCutTimedOut, finalizer.ReasonTrafficCutFailed} {
		if count, err := harness.CountEvents(context.Background(), env.Client, node, reason); err != nil || count > 0 {
			return reason, err
		}
	}
	notes, err := harness.EventNotes(context.Background(), env.Client, node, finalizer.ReasonReleased)
	if slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, "traffic cut: load balancer AdminState Down confirmed")
	}) {
		return cutConfirmedOutcome, err
	}
	return "no event", err
}

// checkEntries checks every backend entry once the admin state settled:
//
//   - no entry is lost;
//   - entries of the nodes that stay (the spares, and the nodes of rounds
//     not run) are None: a node that is not deleted never keeps its traffic
//     cut;
//   - the outbound-only pool is never touched (None);
//   - wantReleasedEntry gives the state of a released node's other entries.
func (s *soak) checkEntries(t *testing.T) string {
	t.Helper()
	cut := map[string]bool{}
	// How each released node's cut ended, by its events: the figures say why
	// a cut was not confirmed (faults past --admin-state-timeout, or a
	// failure), or that no event of it was written (a leader killed first).
	outcomes := map[string]int{}
	for _, n := range s.released {
		outcome, err := cutOutcome(n)
		if err != nil {
			t.Fatal(err)
		}
		outcomes[outcome]++
		cut[n] = outcome == cutConfirmedOutcome
	}
	tally := map[string]int{}
	var wrong []string
	states := s.emu.AdminStates()
	for key, state := range states {
		parts := strings.Split(key, "/")
		pool, node := parts[0]+"/"+parts[1], parts[2]
		want := []string{"None"} // the outbound pool, the spares, rounds not run
		kind := "spare"
		switch {
		case slices.Contains(s.released, node):
			kind = "released"
			if pool != "kubernetes/aksOutboundBackendPool" {
				want = wantReleasedEntry(cut[node])
			}
		case !slices.Contains(s.spares, node):
			kind = "unused"
		}
		tally[kind+" "+state]++
		if !slices.Contains(want, state) {
			wrong = append(wrong, fmt.Sprintf("%s is %s, want %v (traffic cut confirmed: %v)", key, state, want, cut[node]))
		}
	}
	for _, key := range s.entries {
		if _, ok := states[key]; !ok {
			wrong = append(wrong, key+" is gone: a pool write dropped it")
		}
	}
	sort.Strings(wrong)
	for _, w := range wrong {
		t.Errorf("backend entry %s", w)
	}
	confirmed := 0
	for _, c := range cut {
		if c {
			confirmed++
		}
	}
	return fmt.Sprintf("%v; %d of %d released nodes had their cut confirmed (cut outcomes by event: %v)", tally, confirmed, len(s.released), outcomes)
}

// wantReleasedEntry is the admin state an entry of a released node may have.
// nodeguard forgets a node once it is gone and leaves its entries as the
// node's traffic cut left them: Down when Azure confirmed the cut (the event
// TrafficCut), Down or None when the cut ran into ARM faults past
// --admin-state-timeout (the drain went on with TrafficCutTimedOut). This is
// the check to tighten when entries that nodeguard set Down for a node that
// is gone return to None after --azure-admin-state-orphan-grace: then every
// such entry must end None.
func wantReleasedEntry(cutConfirmed bool) []string {
	if cutConfirmed {
		return []string{"Down"}
	}
	return []string{"Down", "None"}
}

// armCallBound is the most ARM calls the soak may take: per released node its
// Down in 4 pools (a GET, a PUT and a poll each, 12), per replica start a
// discovery and a resync (list, 4 GETs, 5), per resync period of the run the
// same, and per fault hit its retries (the SDK's 3, then nodeguard's 3 with a
// fresh GET each, 10). A hot loop or a retry storm goes past it; the real
// count is printed beside it.
func armCallBound(released, starts, resyncs, faultHits int) int {
	return 12*released + 5*starts + 5*resyncs + 10*faultHits
}

// checkARMCalls counts nodeguard's ARM calls by method and resource and holds
// them to armCallBound.
func (s *soak) checkARMCalls(t *testing.T, hit map[faultClass]int, elapsed time.Duration) (string, int) {
	t.Helper()
	byKind := map[string]int{}
	total := 0
	for _, r := range s.emu.Requests() {
		if strings.HasPrefix(r.Path, "/emulator/") {
			continue
		}
		total++
		byKind[r.Method+" "+armemulator.Kind(r.Path)]++
	}
	hits := 0
	for _, n := range hit {
		hits += n
	}
	bound := armCallBound(len(s.released), s.starts(), int(elapsed/soakResync)+1, hits)
	if total > bound {
		t.Errorf("%d ARM calls, more than the bound of %d", total, bound)
	}
	return fmt.Sprintf("%d: %v", total, byKind), bound
}

// checkLeases: no maintenance Lease is left for any soak node, and once both
// replicas stop as in a rolling update (SIGTERM) nobody holds the leader
// election Lease.
func (s *soak) checkLeases(t *testing.T) string {
	t.Helper()
	var leases coordinationv1.LeaseList
	if err := env.Client.List(context.Background(), &leases, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace)); err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, l := range leases.Items {
		if strings.HasPrefix(l.Name, s.run+"-") {
			left++
			t.Errorf("maintenance Lease %s is left, held by %q", l.Name, ptr.Deref(l.Spec.HolderIdentity, ""))
		}
	}
	for _, r := range s.replicas {
		if err := r.stop(15 * time.Second); err != nil {
			t.Errorf("stopping %s: %v", r.name, err)
		}
	}
	var election coordinationv1.Lease
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: s.system(), Name: soakLeaderLease}, &election); err != nil {
		t.Fatal(err)
	}
	if holder := ptr.Deref(election.Spec.HolderIdentity, ""); holder != "" {
		t.Errorf("after both replicas stopped, the leader election Lease is held by %q", holder)
	}
	return fmt.Sprintf("%d maintenance Leases left; leader election Lease released on stop (%d transitions)", left, ptr.Deref(election.Spec.LeaseTransitions, 0))
}
