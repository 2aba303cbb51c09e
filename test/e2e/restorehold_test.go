package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// RestoreRunsEnv sets how many times TestRestoredNoneHoldsAgainstStaleCopies
// plays its four stale copies (default 1; make test-restore-hold runs 10).
const RestoreRunsEnv = "NODEGUARD_RESTORE_RUNS"

// staleCopy is one restore followed by cloud-provider-azure's stale PUT: a
// node on a load balancer of its own (AKS's multiple standard load
// balancers), shut down (its entry Down) and started again (None restored),
// whose pool another writer read while it was Down and PUTs back delay after
// the restore, when a node joins, with its operation polled or left to ARM.
type staleCopy struct {
	name     string
	delay    time.Duration
	unpolled bool

	pool, lb, node, ip, joiner, joinerIP string
	joinerVM                             string
	copy                                 *armemulator.Snapshot

	// restoredAt: nodeguard's write of None; staleAt: ARM accepting the
	// stale PUT (its entry Down again); opEnd: the end of that PUT's
	// operation; noneAt: the write that made the entry None again, and
	// whether nodeguard made it.
	restoredAt, staleAt, opEnd, noneAt time.Time
	noneByNodeguard                    bool
	err                                error
}

func (c *staleCopy) key() string { return c.lb + "/kubernetes/" + c.node }

// restoreHoldRuns numbers the runs in this process: each gets its own
// addresses and VMs.
var restoreHoldRuns = 0

// TestRestoredNoneHoldsAgainstStaleCopies (issue #62): four nodes, each on a
// load balancer of its own, are shut down (the cloud's shutdown taint: their
// entries Down) and started again (taint removed: nodeguard restores None).
// cloud-provider-azure read their pools while they were Down and, when a node
// joins, PUTs a pool back from that copy without If-Match: 20 s and 90 s
// after the restore, each once with its operation polled to its end and once
// left to ARM (30 s, during which the load balancer refuses other writes).
// Each time the entry is None again within 15 s of the end of that
// operation, set by nodeguard with one LoadBalancerAdminStateReverted event
// and one count of loadbalancer_adminstate_reverts_total{state="None"}, and
// nodeguard's writes change nothing else (the joined node stays). The four
// play at once, in real time (about 2.5 minutes); NODEGUARD_RESTORE_RUNS=10
// (make test-restore-hold) plays them 10 times over.
func TestRestoredNoneHoldsAgainstStaleCopies(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	runs := 1
	if s := os.Getenv(RestoreRunsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a count of runs, at least 1", RestoreRunsEnv, s)
		}
		runs = n
	}
	passed := 0
	for i := range runs {
		if t.Run(fmt.Sprintf("run-%d-of-%d", i+1, runs), runStaleCopies) {
			passed++
		}
	}
	t.Logf("%d of %d runs passed", passed, runs)
}

func runStaleCopies(t *testing.T) {
	ctx := context.Background()
	name := freshName("rhold")
	restoreHoldRuns++
	run := restoreHoldRuns
	cases := []*staleCopy{
		{name: "20s-polled", delay: 20 * time.Second},
		{name: "20s-unpolled", delay: 20 * time.Second, unpolled: true},
		{name: "90s-polled", delay: 90 * time.Second},
		{name: "90s-unpolled", delay: 90 * time.Second, unpolled: true},
	}
	seed := armemulator.Seed{Subscription: subscription, ResourceGroup: resourceGroup}
	for i, c := range cases {
		c.pool, c.lb = name, name+"-"+c.name
		c.node, c.joiner = c.lb, c.lb+"-joiner"
		c.ip, c.joinerIP = fmt.Sprintf("10.204.%d.%d", run, i+4), fmt.Sprintf("10.204.%d.%d", run, i+104)
		vm, joinerVM := vmssProviderID(4000+10*run+i), vmssProviderID(4005+10*run+i)
		c.joinerVM = joinerVM
		seed.VMs = append(seed.VMs, strings.TrimPrefix(vm, "azure://"), strings.TrimPrefix(joinerVM, "azure://"))
		seed.LoadBalancers = append(seed.LoadBalancers, armemulator.LoadBalancerSeed{Name: c.lb, Pools: []armemulator.PoolSeed{
			{Name: "kubernetes", Entries: []armemulator.EntrySeed{{Name: c.node, IP: c.ip}}},
		}})
		harness.MustCreate(t, env.Client, builder.Node(c.node, builder.WithLabels("pool", name), builder.WithProviderID(vm), builder.WithInternalIP(c.ip)))
	}
	emu, err := armemulator.Start("127.0.0.1:0", seed,
		armemulator.Options{Async: true, AsyncPolls: 1, UnpolledOperationLifetime: armemulator.LongOperation})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	metricsPort := harness.FreePort(t)
	startNodeguard(t, env.Kubeconfig, emu, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--metrics-secure=false")
	every := func(want string) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			states := emu.AdminStates()
			return !slices.ContainsFunc(cases, func(c *staleCopy) bool { return states[c.key()] != want }), nil
		}
	}
	harness.Eventually(t, 30*time.Second, every("None"), "every node's entry is in its pool, None")

	// Shut down: the cloud's taint, nodeguard sets the entries Down.
	shutdown := corev1.Taint{Key: ngv1alpha1.CloudShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule}
	for _, c := range cases {
		patchTaints(t, c.node, func(ts []corev1.Taint) []corev1.Taint { return append(ts, shutdown) })
	}
	harness.Eventually(t, 30*time.Second, every("Down"), "every shut-down node's entry is Down")
	// cloud-provider-azure's reconcile reads the load balancers now (its
	// cache keeps that copy for up to 120 s).
	for _, c := range cases {
		actor := armemulator.NewCloudProvider(emu)
		actor.Unpolled = c.unpolled
		if c.copy, err = actor.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Started again: the taint goes, nodeguard restores None.
	untainted := time.Now()
	for _, c := range cases {
		patchTaints(t, c.node, func(ts []corev1.Taint) []corev1.Taint {
			return slices.DeleteFunc(ts, func(x corev1.Taint) bool { return x.Key == shutdown.Key })
		})
	}
	harness.Eventually(t, 30*time.Second, every("None"), "every started node's entry is None again")
	history := emu.History()
	for _, c := range cases {
		w, ok := firstWrite(history, c, untainted, func(w armemulator.PoolWrite) bool {
			return armemulator.ByNodeguard(w) && entryState(w, c.node) == "None"
		})
		if !ok {
			t.Fatalf("%s: no nodeguard write restored None after the taint went", c.node)
		}
		c.restoredAt = w.Time
	}
	t.Logf("restored None %s after the taints went", time.Since(untainted).Round(time.Millisecond))

	// The stale PUTs, each delay after its restore, all at once.
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.err = c.play(ctx, emu)
		}()
	}
	wg.Wait()

	history = emu.History()
	for _, c := range cases {
		if c.err != nil {
			t.Errorf("%s: %v", c.name, c.err)
			continue
		}
		late := c.noneAt.Sub(c.opEnd)
		t.Logf("%s: stale PUT %s after the restore; None again %s after its operation ended (%s after the PUT)",
			c.name, c.staleAt.Sub(c.restoredAt).Round(time.Millisecond), late.Round(time.Millisecond), c.noneAt.Sub(c.staleAt).Round(time.Millisecond))
		if !c.noneByNodeguard {
			t.Errorf("%s: the write that set the entry None again was not nodeguard's", c.name)
		}
		if late > revertBound {
			t.Errorf("%s: None again %s after the end of the stale PUT's operation, want within %s", c.name, late, revertBound)
		}
		if c.unpolled {
			if busy := emu.Status(http.MethodPut, "/loadBalancers/"+c.lb+"/backendAddressPools/", http.StatusTooManyRequests); busy == 0 {
				t.Errorf("%s: no nodeguard write met the busy load balancer: the test did not exercise the wait for the operation", c.name)
			}
		}
		if w, downAgain := firstWrite(history, c, c.restoredAt, func(w armemulator.PoolWrite) bool {
			return armemulator.ByNodeguard(w) && entryState(w, c.node) == "Down"
		}); downAgain {
			t.Errorf("%s: nodeguard set the restored entry Down at %s", c.name, w.Time.Format(time.RFC3339Nano))
		}
	}
	if err := armemulator.OnlyAdminStateChanged(history, armemulator.ByNodeguard); err != nil {
		t.Errorf("a nodeguard write changed membership: %v", err)
	}
	states := emu.AdminStates()
	for _, c := range cases {
		if got, joined := states[c.key()], states[c.lb+"/kubernetes/"+c.joiner]; got != "None" || joined != "None" {
			t.Errorf("%s: at the end %s is %q and the joined %s %q, want both None", c.name, c.node, got, c.joiner, joined)
		}
		// One event and one count per stale PUT. The event is written
		// asynchronously; every stale PUT was undone at least 15 s before
		// the last one's, so a second event would be there by now.
		harness.Eventually(t, harness.EventTimeout, func(ctx context.Context) (bool, error) {
			n, err := harness.CountEvents(ctx, env.Client, c.node, "LoadBalancerAdminStateReverted")
			return n > 0, err
		}, "%s: a LoadBalancerAdminStateReverted event about %s", c.name, c.node)
		notes := eventNotes(ctx, t, c.node, "LoadBalancerAdminStateReverted")
		n, err := harness.CountEvents(ctx, env.Client, c.node, "LoadBalancerAdminStateReverted")
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || !strings.Contains(notes[0], "Backend pool "+c.lb+"/kubernetes:") || !strings.Contains(notes[0], "restored to None") {
			t.Errorf("%s: %d LoadBalancerAdminStateReverted events %q, want one naming pool %s/kubernetes and the restore", c.name, n, notes, c.lb)
		}
		series := fmt.Sprintf(`loadbalancer_adminstate_reverts_total{pool="%s/kubernetes",state="None"}`, c.lb)
		if got := scrapeCounter(t, metricsPort, series); got != 1 {
			t.Errorf("%s: %s = %v, want 1", c.name, series, got)
		}
	}
}

// play waits delay after the restore, then a node joins and the other writer
// PUTs the pool from its copy read while the node was Down, and waits until
// the entry is None again.
func (c *staleCopy) play(ctx context.Context, emu *armemulator.Server) error {
	timer := time.NewTimer(time.Until(c.restoredAt.Add(c.delay)))
	defer timer.Stop()
	<-timer.C
	if err := env.Client.Create(ctx, builder.Node(c.joiner, builder.WithLabels("pool", c.pool),
		builder.WithProviderID(c.joinerVM), builder.WithInternalIP(c.joinerIP))); err != nil {
		return err
	}
	start := time.Now()
	nodes := []armemulator.Node{{Name: c.node, IPs: []string{c.ip}}, {Name: c.joiner, IPs: []string{c.joinerIP}}}
	if _, err := c.copy.EnsureHostsInPool(ctx, c.lb, "kubernetes", nodes); err != nil {
		return fmt.Errorf("the stale PUT: %w", err)
	}
	returned := time.Now()
	stale, ok := firstWrite(emu.History(), c, start, func(w armemulator.PoolWrite) bool { return !armemulator.ByNodeguard(w) })
	if !ok || entryState(stale, c.node) != "Down" || entryState(stale, c.joiner) != "None" {
		return fmt.Errorf("the stale PUT was not applied as read (entry Down, the joined node None): %+v", stale)
	}
	c.staleAt = stale.Time
	c.opEnd = returned // polled to its end
	if c.unpolled {
		c.opEnd = c.staleAt.Add(armemulator.LongOperation)
	}
	err := harness.Poll(ctx, time.Until(c.opEnd)+revertBound+10*time.Second, func(context.Context) (bool, error) {
		return emu.AdminStates()[c.key()] == "None", nil
	})
	if err != nil {
		return fmt.Errorf("the entry is still %s %s after the stale PUT: %w", emu.AdminStates()[c.key()], time.Since(c.staleAt).Round(time.Second), err)
	}
	none, ok := firstWrite(emu.History(), c, c.staleAt.Add(time.Nanosecond), func(w armemulator.PoolWrite) bool { return entryState(w, c.node) == "None" })
	if !ok {
		return fmt.Errorf("no write set the entry None after the stale PUT")
	}
	c.noneAt, c.noneByNodeguard = none.Time, armemulator.ByNodeguard(none)
	return nil
}

// firstWrite is the first write to the case's pool at or after from that
// matches.
func firstWrite(history []armemulator.PoolWrite, c *staleCopy, from time.Time, match func(armemulator.PoolWrite) bool) (armemulator.PoolWrite, bool) {
	for _, w := range history {
		if w.LoadBalancer == c.lb && w.Pool == "kubernetes" && !w.Time.Before(from) && match(w) {
			return w, true
		}
	}
	return armemulator.PoolWrite{}, false
}

// entryState is the admin state of the node's entry in a write ("" when
// absent).
func entryState(w armemulator.PoolWrite, node string) string {
	for _, e := range w.Entries {
		if e.Name == node {
			return e.AdminState
		}
	}
	return ""
}
