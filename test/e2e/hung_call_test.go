package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestHungARMCall: ARM takes the requests and never answers. Each try of a
// call ends at the per-try timeout (a quarter of --azure-request-timeout) and
// the SDK tries again within the attempt; the attempt ends at
// --azure-request-timeout and is retried after the retry interval, with a
// LoadBalancerAdminStateUpdateRetrying Warning that names the timeout. The
// drain does not wait for it: past --admin-state-timeout it goes on with a
// TrafficCutTimedOut Warning, and the node is released.
func TestHungARMCall(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	const (
		requestTimeout = 12 * time.Second
		// publicPool hangs on its GET, internalPool on its PUT.
		publicPool   = "/loadBalancers/kubernetes/backendAddressPools/kubernetes"
		internalPool = "/loadBalancers/kubernetes-internal/backendAddressPools/kubernetes"
	)
	// A do-not-evict pod holds the node after the drain, so that the hung
	// calls end while the node is still there to receive their events.
	top := newTopology(t, "hung", true)
	emu := top.emulator
	startNodeguard(t, env.Kubeconfig, emu, "--admin-state-timeout=1s", "--azure-request-timeout="+requestTimeout.String())
	harness.WaitForTerminationFinalizer(t, env.Client, top.target)
	hungFrom := time.Now()
	emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: publicPool, Hang: true})
	emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: internalPool, Hang: true})

	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", top.target, "--wait=false")
	harness.WaitForEvent(t, env.Client, top.target, "TrafficCutTimedOut")
	if notes := eventNotes(ctx, t, top.target, "TrafficCutTimedOut"); !slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, "within --admin-state-timeout")
	}) {
		t.Errorf("TrafficCutTimedOut events %q: want the one for --admin-state-timeout (the hung calls last %s)", notes, requestTimeout)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, top.target)
		var apps []string
		for _, p := range pods {
			apps = append(apps, p.Labels["app"])
		}
		slices.Sort(apps)
		return err == nil && slices.Equal(apps, []string{"daemon", "keep"}), err
	}, "the drain goes on without a confirmed traffic cut: all but the do-not-evict pod (and the DaemonSet pod, last) are gone")

	// Each hung try ends at the per-try timeout, and the SDK tries again
	// within the attempt.
	const tryTimeout = requestTimeout / 4
	hung := func(method, path string) []armemulator.Request {
		var out []armemulator.Request
		for _, r := range emu.Requests() {
			if r.Method == method && strings.EqualFold(r.Path, "/subscriptions/"+subscription+"/resourceGroups/"+resourceGroup+"/providers/Microsoft.Network"+path) && r.Start.After(hungFrom) {
				out = append(out, r)
			}
		}
		return out
	}
	harness.Eventually(t, requestTimeout+30*time.Second, func(context.Context) (bool, error) {
		return len(hung(http.MethodGet, publicPool)) >= 2 && len(hung(http.MethodPut, internalPool)) >= 2, nil
	}, "the hung GET and PUT were each tried again after a per-try timeout")
	for _, r := range append(hung(http.MethodGet, publicPool), hung(http.MethodPut, internalPool)...) {
		took := r.Time.Sub(r.Start)
		t.Logf("hung %s %s ended after %s", r.Method, r.Path, took.Round(time.Millisecond))
		if took < tryTimeout-500*time.Millisecond || took > tryTimeout+5*time.Second {
			t.Errorf("hung %s %s ended after %s, want about the per-try timeout (%s)", r.Method, r.Path, took.Round(time.Millisecond), tryTimeout)
		}
	}

	// The attempt runs out: retriable, with a Warning that says why.
	harness.Eventually(t, requestTimeout+30*time.Second, func(ctx context.Context) (bool, error) {
		return len(eventNotes(ctx, t, top.target, "LoadBalancerAdminStateUpdateRetrying")) > 0, nil
	}, "a LoadBalancerAdminStateUpdateRetrying event")
	for _, n := range eventNotes(ctx, t, top.target, "LoadBalancerAdminStateUpdateRetrying") {
		if !strings.Contains(n, "context deadline exceeded") || !strings.Contains(n, "/kubernetes ") {
			t.Errorf("LoadBalancerAdminStateUpdateRetrying %q: want a pool and the request timeout as the cause", n)
		}
	}
	states := emu.AdminStates()
	for _, entry := range []string{"kubernetes/kubernetes/" + resourceGroup + "-" + top.target, "kubernetes-internal/kubernetes/" + top.target} {
		if got := states[entry]; got != "None" {
			t.Errorf("entry %s is %s: no write completed, so it must still be None", entry, got)
		}
	}

	top.releaseHeld(ctx, t)
}

// eventNotes returns the notes of the events with the reason about the named
// object, failing the test when they cannot be listed.
func eventNotes(ctx context.Context, t *testing.T, regarding, reason string) []string {
	t.Helper()
	notes, err := harness.EventNotes(ctx, env.Client, regarding, reason)
	if err != nil {
		t.Fatal(err)
	}
	return notes
}
