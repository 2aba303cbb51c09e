package finalizer

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestDrainWritesLifecycleConditions: while a PDB holds the drain, the node
// carries KEP-5683's DrainInProgress=True and nodeguard's condition lists the
// blockers grouped as cluster-api does, the PDB with its numbers; once the
// pods are gone, Drained=True and DrainInProgress=False. Another finalizer
// keeps the node after nodeguard releases it, to read the end state.
func TestDrainWritesLifecycleConditions(t *testing.T) {
	f := newFixture(t, "lifecycle")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready(), builder.WithFinalizers("example.com/keep"))
	web := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }
	readyPod(t, f.pod(t, "web-0", node, web))
	readyPod(t, f.pod(t, "web-1", node, web))
	f.pdb(t, "web", builder.MaxUnavailable("1"), 0, 1, 1, 2) // one replica elsewhere not Ready: no disruption
	f.deleteNode(t, node)

	wantBlockers := "\n* Pods " + f.ns + "/web-0, " + f.ns + "/web-1: under PDB " + f.ns +
		"/web (allows 0 disruptions: currentHealthy 1, desiredHealthy 1, expectedPods 2)"
	f.passUntil(t, node, func() bool {
		f.clock.Step(conditionRefresh)
		c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition)
		return c != nil && c.Reason == "Draining" && strings.HasPrefix(c.Message, "Drain not completed yet (started at ") &&
			strings.Contains(c.Message, wantBlockers)
	}, "the Terminating condition lists the pods under PDB web with its numbers")
	n := getNode(t, node)
	if c := condition(n, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionTrue || c.Reason != LifecycleReasonAdminRequested {
		t.Errorf("DrainInProgress is %+v while the node drains, want True (%s)", c, LifecycleReasonAdminRequested)
	}
	if c := condition(n, corev1.NodeDrained); c != nil {
		t.Errorf("Drained is %+v before the drain is done, want none", c)
	}
	started := condition(n, corev1.NodeDrainInProgress).LastTransitionTime.UTC().Format(time.RFC3339)
	if c := condition(n, ngv1alpha1.TerminatingCondition); !strings.Contains(c.Message, "(started at "+started+"):") {
		t.Errorf("condition message %q, want the drain's start %s (DrainInProgress's transition)", c.Message, started)
	}

	f.pdbStatus(t, "web", 2, 2, 1, 2)
	f.passUntil(t, node, func() bool {
		return f.podState(t, "web-0") != "running" && f.podState(t, "web-1") != "running"
	}, "the PDB allowing two disruptions evicts both pods")
	f.finish(t, "web-0")
	f.finish(t, "web-1")
	f.passUntil(t, node, func() bool {
		c := condition(getNode(t, node), corev1.NodeDrained)
		return c != nil && c.Status == corev1.ConditionTrue
	}, "the drained node carries Drained=True")
	n = getNode(t, node)
	if c := condition(n, corev1.NodeDrained); c.Reason != LifecycleReasonDrainCompleted {
		t.Errorf("Drained %+v, want reason %s", c, LifecycleReasonDrainCompleted)
	}
	if c := condition(n, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionFalse || c.Reason != LifecycleReasonDrainCompleted {
		t.Errorf("DrainInProgress %+v after the drain, want False (%s)", c, LifecycleReasonDrainCompleted)
	}
}

// TestStatusWrittenOnlyWhenAWaitLasts: a terminating node's conditions are
// written once a change has waited StatusSettle, with everything staged
// meanwhile, and a node that nodeguard's finalizer alone keeps is not written
// at its release: its status goes with it.
func TestStatusWrittenOnlyWhenAWaitLasts(t *testing.T) {
	f := newFixture(t, "settle")
	f.r.Opts.StatusSettle = DefaultStatusSettle
	var writes atomic.Int32
	counting, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	f.r.Client = interceptor.NewClient(counting, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			if _, ok := obj.(*corev1.Node); ok && sub == "status" && err == nil {
				writes.Add(1) // once written: the test reads the node next
			}
			return err
		},
	})
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	f.pod(t, "web", node, controlledBy("ReplicaSet")) // evicted, it stays terminating
	f.deleteNode(t, node)

	started := f.clock.Now()
	f.passUntil(t, node, func() bool { return f.podState(t, "web") == "terminating" }, "the pod is evicted")
	f.pass(t, node)
	if n := getNode(t, node); writes.Load() != 0 || condition(n, ngv1alpha1.TerminatingCondition) != nil {
		t.Fatalf("%d status writes within the settle, conditions %+v: want none yet", writes.Load(), n.Status.Conditions)
	}

	// No pass runs: the node's timer writes what lasted.
	f.clock.Step(DefaultStatusSettle)
	harness.Eventually(t, 2*DefaultStatusSettle, func(context.Context) (bool, error) {
		return writes.Load() > 0, nil
	}, "the conditions are written once they have lasted the settle, without a pass")
	n := getNode(t, node)
	c := condition(n, corev1.NodeDrainInProgress)
	if writes.Load() != 1 || c == nil || c.Status != corev1.ConditionTrue || condition(n, ngv1alpha1.TerminatingCondition).Reason != "Draining" {
		t.Fatalf("after the settle: %d status writes, conditions %+v; want one write saying the node drains", writes.Load(), n.Status.Conditions)
	}
	if !c.LastTransitionTime.Time.Equal(started.Truncate(time.Second)) {
		t.Errorf("DrainInProgress transition %v, want when the drain began (%v), not when it was written", c.LastTransitionTime, started)
	}

	f.finish(t, "web")
	f.passUntil(t, node, func() bool { return len(f.events.with(ReasonReleased)) > 0 }, "the node is released")
	if writes.Load() != 1 {
		t.Errorf("%d status writes, want 1: the release of a node nothing else keeps writes no status", writes.Load())
	}
}

// TestStatusSettlesLongerWhileNodesWaitForASlot: while a node waits for a
// drain slot (a fleet's deletion), the waiting node's change is written once
// it has waited fleetLineSettle, not StatusSettle nor fleetStatusSettle: its
// condition is not written at 3s nor at 10s, and is at 30s. Once no node
// waits, 3s again.
func TestStatusSettlesLongerWhileNodesWaitForASlot(t *testing.T) {
	f := newFixture(t, "fleetsettle")
	f.r.Opts.StatusSettle = DefaultStatusSettle
	f.r.Opts.MaxConcurrentNodes = 1
	first, second := f.ns+"-a", f.ns+"-b"
	for _, node := range []string{first, second} {
		f.node(t, node, builder.Ready())
		f.pod(t, "web-"+node, node, controlledBy("ReplicaSet")) // evicted, it stays terminating
		f.deleteNode(t, node)
	}
	f.passUntil(t, first, func() bool { return f.podState(t, "web-"+first) == "terminating" }, "the first node drains")
	f.pass(t, second)
	if _, waiting := f.r.slots.count(); waiting != 1 {
		t.Fatalf("%d nodes wait for a slot, want the second", waiting)
	}

	f.clock.Step(DefaultStatusSettle)
	f.pass(t, second)
	if c := condition(getNode(t, second), ngv1alpha1.TerminatingCondition); c != nil {
		t.Fatalf("the waiting node's condition was written after %s while a node waits: %+v", DefaultStatusSettle, c)
	}
	f.clock.Step(fleetStatusSettle - DefaultStatusSettle)
	f.pass(t, second)
	if c := condition(getNode(t, second), ngv1alpha1.TerminatingCondition); c != nil {
		t.Fatalf("the waiting node's condition was written after %s in line: %+v", fleetStatusSettle, c)
	}
	f.clock.Step(fleetLineSettle - fleetStatusSettle)
	f.pass(t, second)
	if c := condition(getNode(t, second), ngv1alpha1.TerminatingCondition); c == nil || c.Reason != "WaitingForDrainSlot" {
		t.Fatalf("after %s the waiting node carries %+v, want WaitingForDrainSlot", fleetLineSettle, c)
	}

	// The first node's pod goes: the second takes the slot, and no node
	// waits. Its drain is written after StatusSettle.
	f.finish(t, "web-"+first)
	f.passUntil(t, first, func() bool { return len(f.events.with(ReasonReleased)) > 0 }, "the first node is released")
	f.passUntil(t, second, func() bool { return f.podState(t, "web-"+second) == "terminating" }, "the second node drains")
	f.clock.Step(DefaultStatusSettle)
	f.pass(t, second)
	if c := condition(getNode(t, second), ngv1alpha1.TerminatingCondition); c == nil || c.Reason != "Draining" {
		t.Errorf("%s after the slot was taken and no node waits, the node carries %+v, want Draining", DefaultStatusSettle, c)
	}
}

// TestStatusSettlesLongerFromAFleetsFirstPass: a fleet's deletion settles
// its status writes from the first pass of its nodes, while they all cordon
// and cut traffic and none waits for a slot yet (more nodes terminate than
// --max-concurrent-drains): fleetLineSettle for a node in line,
// fleetStatusSettle once it began to drain. A deletion within the slots, or
// with no limit, settles for StatusSettle.
func TestStatusSettlesLongerFromAFleetsFirstPass(t *testing.T) {
	r := &Reconciler{Opts: Options{StatusSettle: DefaultStatusSettle, MaxConcurrentNodes: 2}}
	for i := range 3 {
		uid := types.UID(fmt.Sprintf("fleet-%d", i))
		r.phases.set(uid, string(uid), phaseTraffic)
		t.Cleanup(func() { r.phases.forget(uid) })
	}
	if got := r.statusSettle("fleet-0"); got != fleetLineSettle {
		t.Errorf("3 nodes cutting traffic under 2 slots settle for %s, want %s", got, fleetLineSettle)
	}
	if ok, _ := r.slots.take(2, "fleet-0", slotHolder{name: "fleet-0"}); !ok {
		t.Fatal("no slot for the first node")
	}
	t.Cleanup(func() { r.slots.give(2, "fleet-0", true) })
	if got := r.statusSettle("fleet-0"); got != fleetStatusSettle {
		t.Errorf("a draining node of the fleet settles for %s, want %s", got, fleetStatusSettle)
	}
	r.phases.forget("fleet-2")
	if got := r.statusSettle("fleet-1"); got != DefaultStatusSettle {
		t.Errorf("2 nodes under 2 slots settle for %s, want %s", got, DefaultStatusSettle)
	}
	r.Opts.MaxConcurrentNodes = 0
	r.phases.set("fleet-2", "fleet-2", phaseTraffic)
	if got := r.statusSettle("fleet-1"); got != DefaultStatusSettle {
		t.Errorf("3 nodes with no slot limit settle for %s, want %s", got, DefaultStatusSettle)
	}
}

// TestStatusTimerFiresAsSoonAsTheShorterSettle: a node in line armed its
// timer for fleetLineSettle; once it drains, fleetStatusSettle is due sooner,
// and the timer fires then, not at the line's settle.
func TestStatusTimerFiresAsSoonAsTheShorterSettle(t *testing.T) {
	r := &Reconciler{Clock: clocktesting.NewFakeClock(time.Now())}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "in-line", UID: "in-line"}}
	r.flushLater(node, time.Hour)
	r.flushLater(node, time.Millisecond)
	harness.Eventually(t, 5*time.Second, func(context.Context) (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.memory[node.UID].status.timer == nil, nil // flushTimed clears it
	}, "the timer fires after the shorter wait")
}

// TestStatusTimerLeavesTheWriteToAPassInFlight: a timer that fires while a
// pass of the node is in flight (a drain pass waiting for its evictions)
// writes nothing: the pass writes at its end, with what it staged meanwhile.
// Once no pass is in flight, the timer writes.
func TestStatusTimerLeavesTheWriteToAPassInFlight(t *testing.T) {
	f := newFixture(t, "inpass")
	name := f.ns + "-node"
	f.node(t, name, builder.Ready())
	node := getNode(t, name)
	f.r.stageCondition(node, corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue, Reason: LifecycleReasonAdminRequested})

	f.r.markPassing(node.UID, true)
	f.r.flushTimed(node)
	if c := condition(getNode(t, name), corev1.NodeDrainInProgress); c != nil {
		t.Fatalf("the timer wrote %+v amid the node's pass", c)
	}
	f.r.markPassing(node.UID, false)
	f.r.flushTimed(node)
	if c := condition(getNode(t, name), corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("after the pass the timer wrote %+v, want DrainInProgress=True", c)
	}
}

// TestDrainEndedCountsOnlyADrainSinceTheDeletion: after a restart the drain's
// end is read from the Drained condition, but only one written since the
// deletion: a node drained by kubectl drain, then deleted, still drains
// (and takes a drain slot) under nodeguard.
func TestDrainEndedCountsOnlyADrainSinceTheDeletion(t *testing.T) {
	deleted := metav1.NewTime(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))
	r := &Reconciler{Clock: clocktesting.NewFakeClock(deleted.Add(time.Minute))}
	for _, tc := range []struct {
		name    string
		drained time.Time
		want    bool
	}{
		{"drained after the deletion", deleted.Add(10 * time.Second), true},
		{"drained in the second of the deletion", deleted.Time, true},
		{"drained by someone else before the deletion", deleted.Add(-time.Hour), false},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: types.UID(tc.name), DeletionTimestamp: &deleted},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeDrained, Status: corev1.ConditionTrue,
				Reason: LifecycleReasonDrainCompleted, LastTransitionTime: metav1.NewTime(tc.drained)}}}}
		at, ok := r.drainEnded(node)
		if ok != tc.want || (ok && !at.Equal(tc.drained)) {
			t.Errorf("%s: drainEnded = %v, %v; want %v", tc.name, at, ok, tc.want)
		}
	}
}

// TestWrittenConditionsOutliveAStaleCache: a draining node is read from the
// cache, which may not have seen nodeguard's last status write yet. The pass
// must read the conditions as written: DrainInProgress is not staged again
// (a second write, and a drain start moved later), and a condition removed
// stays removed.
func TestWrittenConditionsOutliveAStaleCache(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))
	r := &Reconciler{Clock: clock}
	uid := types.UID("n1")
	r.mu.Lock()
	r.remember(uid)
	r.mu.Unlock()
	fresh := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: uid}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: ngv1alpha1.TrafficCutCondition, Status: corev1.ConditionTrue},
		}}}
	}

	node := fresh()
	r.markDrainInProgress(node)
	r.stageRemoval(node, ngv1alpha1.TrafficCutCondition)
	began := nodeCondition(node, corev1.NodeDrainInProgress).LastTransitionTime
	r.mu.Lock()
	staged := r.memory[uid].staged
	r.memory[uid].staged = nil
	r.mu.Unlock()
	r.rememberWritten(uid, staged) // as a successful status write does

	clock.Step(5 * time.Second)
	stale := fresh() // the cache has not seen the write
	r.overlayStaged(stale)
	r.markDrainInProgress(stale)
	r.mu.Lock()
	again := r.memory[uid].staged
	r.mu.Unlock()
	if again != nil {
		t.Errorf("a pass over a stale copy staged %+v again, want nothing: the write carried it", again)
	}
	if c := nodeCondition(stale, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&began) {
		t.Errorf("DrainInProgress read as %+v, want True since %s (the drain's start, as written)", c, began)
	}
	if c := nodeCondition(stale, ngv1alpha1.TrafficCutCondition); c != nil {
		t.Errorf("TrafficCut read as %+v, want it removed, as written", c)
	}
}
