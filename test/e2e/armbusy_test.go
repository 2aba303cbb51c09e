package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestCutHoldsThroughAnotherWritersLongOperations: two nodes drain (held by
// do-not-evict pods) behind a public and an internal load balancer. Another
// writer that read the load balancers before the cut (the cloud-provider-azure
// actor, while a node joins) PUTs both pools back as it read them, without
// If-Match, and leaves its operations to ARM: each keeps its load balancer
// busy for 30 s, so nodeguard's rewrite is answered "another operation is
// updating the resource" until it ends. First one such revert, then three in
// a row, each PUT as soon as the one before ended: the load balancers stay
// busy for 90 s, three times the retry budget. Busy is not failure: every
// entry is Down again within 15 s of the end of the operation that last
// reverted it, nothing is reported failed, and the revert-open histogram
// records each revert as open for at least the operation's length.
func TestCutHoldsThroughAnotherWritersLongOperations(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	f := newCoexistFixture(t, "busy", 2, 4, 2, armemulator.Options{UnpolledOperationLifetime: armemulator.LongOperation})
	name, emu, metricsPort, leaving := f.name, f.emu, f.metricsPort, f.leaving
	other := armemulator.NewCloudProvider(emu)
	other.Unpolled = true
	before, err := other.Read(ctx) // a reconcile that starts before the cut
	if err != nil {
		t.Fatal(err)
	}

	harness.MustKubectl(t, env.Kubeconfig, "", append([]string{"delete", "node", "--wait=false"}, leaving...)...)
	allDown := f.allDown
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) { return allDown(), nil }, "every leaving node is Down in both pools")

	// revert adds a node (the other writer's reconcile puts it in the
	// pools) and PUTs both pools from the copy read before the cut, as soon
	// as no operation is in progress on either load balancer.
	revert := func(what string) {
		t.Helper()
		f.addNode()
		nodes, err := clusterNodes(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, armemulator.LongOperation+10*time.Second, func(context.Context) (bool, error) {
			return !emu.Busy(coexistPools[0][0]) && !emu.Busy(coexistPools[1][0]), nil
		}, "%s: no operation in progress", what)
		for _, p := range coexistPools {
			if _, err := before.EnsureHostsInPool(ctx, p[0], p[1], nodes); err != nil {
				t.Fatal(err)
			}
		}
		if allDown() {
			t.Fatalf("%s: the stale PUTs left the cut in place, want it undone until nodeguard rewrites it", what)
		}
		t.Logf("%s: both pools PUT back from before the cut, operations left in progress", what)
	}
	backDown := func(what string) {
		t.Helper()
		harness.Eventually(t, armemulator.LongOperation+2*revertBound, func(context.Context) (bool, error) { return allDown(), nil },
			"%s: the leaving nodes are Down again after the other writer's operation", what)
	}
	revert("one revert")
	backDown("one revert")
	for i := range 3 {
		revert(fmt.Sprintf("revert %d of 3 in a row", i+1))
	}
	backDown("three reverts in a row")

	// Every revert was undone within revertBound of the end of the
	// operation that last reverted it: the other writer's PUTs were applied
	// when ARM accepted them, and each operation ended
	// LongOperation later.
	history := emu.History()
	spans, open := revertSpans(history, leaving)
	var others []time.Time
	for _, w := range history {
		if !armemulator.ByNodeguard(w) && w.By != "seed" {
			others = append(others, w.Time)
		}
	}
	for _, sp := range spans {
		var last time.Time
		for _, at := range others {
			if !at.After(sp.to) {
				last = at
			}
		}
		if late := sp.to.Sub(last.Add(armemulator.LongOperation)); late > revertBound {
			t.Errorf("a revert (open %s) was undone %s after the end of the operation that last reverted it, want within %s", sp.to.Sub(sp.from), late, revertBound)
		}
	}
	if want := 2 * len(coexistPools) * len(leaving); len(spans) < want {
		t.Errorf("%d reverts seen in the history, want at least %d (one revert, then one spanning three)", len(spans), want)
	}
	if len(open) > 0 {
		t.Errorf("reverts never undone: %v", open)
	}
	if busy := emu.Status(http.MethodPut, "/backendAddressPools/", http.StatusTooManyRequests); busy == 0 {
		t.Errorf("no nodeguard write met a busy load balancer: the test did not exercise the wait")
	}
	for _, n := range leaving {
		if notes := eventNotes(ctx, t, n, "LoadBalancerAdminStateUpdateFailed"); len(notes) > 0 {
			t.Errorf("%s: LoadBalancerAdminStateUpdateFailed %q while ARM was only busy", n, notes)
		}
	}

	// The histogram: every revert observed once nodeguard's rewrite is
	// confirmed (its operation polled to the end, a moment after the entries
	// read Down), each open for at least about the operation's length (found
	// within a verification interval of the PUT, closed after the
	// operation).
	const metric = "loadbalancer_adminstate_revert_open_seconds"
	sum := func(series string) float64 {
		var v float64
		for _, p := range coexistPools {
			v += scrapeCounter(t, metricsPort, fmt.Sprintf(series, p[0]+"/"+p[1]))
		}
		return v
	}
	want := float64(len(spans))
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) { return sum(metric+`_count{pool="%s",state="Down"}`) >= want, nil },
		"%s counts every revert (%v)", metric, want)
	if short := sum(metric + `_bucket{pool="%s",state="Down",le="16"}`); short > 0 {
		t.Errorf("%s has %v reverts open 16 s or less, want none (each waited out a 30 s operation)", metric, short)
	}

	// Release the nodes, so that no finalizer outlives the test.
	if err := env.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(name)); err != nil {
		t.Fatal(err)
	}
	for _, n := range leaving {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, n) }, "node %s is released", n)
	}
}
