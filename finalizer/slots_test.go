package finalizer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestDrainSlotsGoInTheOrderTerminationsBegan: with 2 slots, free slots go
// to whoever asks while nobody waits; once nodes wait, a slot given back goes
// to the node that began terminating first, whichever node's pass asks
// first; and a node that stopped asking holds no one back.
func TestDrainSlotsGoInTheOrderTerminationsBegan(t *testing.T) {
	var s drainSlots
	now := time.Now()
	holder := func(name string, began int) slotHolder {
		return slotHolder{name: name, since: now.Add(time.Duration(began) * time.Second), asked: now}
	}
	a, b, c, d := holder("a", 0), holder("b", 1), holder("c", 2), holder("d", 2)

	if ok, _ := s.take(2, "d", d); !ok {
		t.Fatal("d did not get a free slot with nobody waiting")
	}
	if ok, _ := s.take(2, "c", c); !ok {
		t.Fatal("c did not get the second free slot")
	}
	if ok, ahead := s.take(2, "b", b); ok || ahead != 0 {
		t.Fatalf("b: slot %v, %d ahead; want to wait first in line (both slots held)", ok, ahead)
	}
	if ok, ahead := s.take(2, "a", a); ok || ahead != 0 {
		t.Fatalf("a: slot %v, %d ahead; want to wait first in line (it began before b)", ok, ahead)
	}
	if _, ahead := s.take(2, "b", b); ahead != 1 {
		t.Fatalf("b has %d nodes ahead, want 1 (a)", ahead)
	}
	if next := s.give(2, "c", true); !slices.Equal(next, []string{"a"}) {
		t.Fatalf("c's slot wakes %v, want [a]", next)
	}
	// b asks before a, woken, does: the slot is a's.
	if ok, ahead := s.take(2, "b", b); ok || ahead != 1 {
		t.Fatalf("b took the slot given to a (slot %v, %d ahead)", ok, ahead)
	}
	if ok, _ := s.take(2, "a", a); !ok {
		t.Fatal("a, first in line, did not get the free slot")
	}
	if held, waiting := s.count(); held != 2 || waiting != 1 {
		t.Fatalf("%d held, %d waiting; want 2 and 1", held, waiting)
	}
	// d's passes stop without a release: past slotExpiry its slot is b's.
	b.asked = now.Add(slotExpiry + time.Second)
	a.asked = b.asked
	if ok, _ := s.take(2, "a", a); !ok {
		t.Fatal("a lost its slot")
	}
	if ok, _ := s.take(2, "b", b); !ok {
		t.Fatal("d's slot, unclaimed past slotExpiry, was not freed for b")
	}
	if next := s.give(2, "never-held", true); next != nil {
		t.Fatalf("giving back a slot never held wakes %v", next)
	}
}

// TestMaxConcurrentDrainsBoundsTheNodesEvictingAtOnce: three nodes deleted at
// once with --max-concurrent-drains=2. All three are cordoned at once; the
// pods of the first two are evicted, and the third waits, saying so in its
// condition and the phase gauge (and, once released, NodeReleased), until a
// node is released: its slot then wakes the third at once (well before the
// slot wait's backstop).
func TestMaxConcurrentDrainsBoundsTheNodesEvictingAtOnce(t *testing.T) {
	f := newFixture(t, "slots")
	nodes := []string{f.ns + "-a", f.ns + "-b", f.ns + "-c"}
	for _, n := range nodes {
		f.node(t, n)
		f.pod(t, "pod-"+n[len(n)-1:], n)
	}
	waitingBefore := testutil.ToFloat64(nodesInPhase.WithLabelValues(phaseDrainSlot))
	f.startController(t, Options{MaxConcurrentNodes: 2})
	for _, n := range nodes { // a second apart: the order their terminations begin
		f.deleteNode(t, n)
	}

	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "pod-a") == "terminating" && f.podState(t, "pod-b") == "terminating", nil
	}, "the first two nodes evict their pods and the third waits for a slot")
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		c := condition(getNode(t, nodes[2]), ngv1alpha1.TerminatingCondition)
		return c != nil && c.Reason == "WaitingForDrainSlot", nil
	}, "the third node's condition says it waits for a drain slot")
	third := getNode(t, nodes[2])
	if c := condition(third, ngv1alpha1.TerminatingCondition); !strings.Contains(c.Message, "2 nodes drain at once (--max-concurrent-drains)") {
		t.Errorf("condition message %q, want it to name the limit and the flag", c.Message)
	}
	if !third.Spec.Unschedulable || drainingTaint(third) == nil {
		t.Error("the waiting node is not cordoned and tainted: cordons must not wait for a slot")
	}
	if got := f.podState(t, "pod-c"); got != "running" {
		t.Fatalf("pod-c is %s while two nodes drain with --max-concurrent-drains=2", got)
	}
	if got := testutil.ToFloat64(nodesInPhase.WithLabelValues(phaseDrainSlot)) - waitingBefore; got != 1 {
		t.Errorf("nodeguard_termination_nodes{phase=%q} grew by %v, want 1", phaseDrainSlot, got)
	}

	f.finish(t, "pod-a")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, nodes[0])
	}, "the first node is released once its pod is gone")
	// Well within slotWaitBackstop: the released slot wakes the third node.
	harness.Eventually(t, slotWaitBackstop/2, func(context.Context) (bool, error) {
		return f.podState(t, "pod-c") == "terminating", nil
	}, "the released slot wakes the third node, which evicts its pod")
	if got := f.podState(t, "pod-b"); got != "terminating" {
		t.Errorf("pod-b is %s, want still terminating (its kubelet has not confirmed)", got)
	}

	f.finish(t, "pod-b")
	f.finish(t, "pod-c")
	for _, n := range nodes[1:] {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "node %s is released", n)
	}
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return len(f.events.with(ReasonReleased)) == 3, nil
	}, "three NodeReleased events")
	if waited := slices.DeleteFunc(f.events.with(ReasonReleased), func(e string) bool { return !strings.Contains(e, "waited for a drain slot") }); len(waited) != 1 ||
		!strings.Contains(waited[0], "kube-node-maintenance/"+nodes[2]+" ") {
		t.Errorf("NodeReleased events saying the node waited for a drain slot: %q, want the third node's", waited)
	}
	if got := testutil.ToFloat64(nodesInPhase.WithLabelValues(phaseDrainSlot)) - waitingBefore; got != 0 {
		t.Errorf("nodeguard_termination_nodes{phase=%q} is %v above where it began with every node gone", phaseDrainSlot, got)
	}
}

// TestNodeWaitingForASlotSleepsThroughPDBChanges: a node waiting for a drain
// slot has no eviction queue, so no PDB change runs a pass of it (at fleet
// size every eviction changes a PDB, and each pass reads the node); its
// condition says what it waits for; and once the draining node is released
// it takes the slot and evicts.
func TestNodeWaitingForASlotSleepsThroughPDBChanges(t *testing.T) {
	f := newFixture(t, "slotsleep")
	f.r.Opts.MaxConcurrentNodes = 1
	first, second := f.ns+"-a", f.ns+"-b"
	for _, n := range []string{first, second} {
		f.node(t, n)
	}
	web := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }
	f.pod(t, "web-a", first, web)
	f.pod(t, "web-b", second, web)
	f.pdb(t, "web", builder.MaxUnavailable("1"), 1, 2, 1, 2)
	f.deleteNode(t, first)
	f.deleteNode(t, second)

	f.pass(t, first)
	f.pass(t, second)
	if got := []string{f.podState(t, "web-a"), f.podState(t, "web-b")}; got[0] != "terminating" || got[1] != "running" {
		t.Fatalf("web-a, web-b are %v; want the first node's pod evicted and the second's waiting", got)
	}
	var pdb policyv1.PodDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "web"}, &pdb); err != nil {
		t.Fatal(err)
	}
	for _, req := range f.r.terminatingNodes(context.Background(), &pdb) {
		if req.Name == second {
			t.Errorf("a change of PDB %s would run a pass of %s, which waits for a drain slot", pdb.Name, second)
		}
	}
	if c := condition(getNode(t, second), ngv1alpha1.TerminatingCondition); c == nil || c.Reason != "WaitingForDrainSlot" {
		t.Errorf("condition %+v, want reason WaitingForDrainSlot", c)
	}

	f.finish(t, "web-a")
	f.pass(t, first)
	if gone, err := harness.NodeGone(context.Background(), env.Client, first); !gone || err != nil {
		t.Fatalf("the first node is not released once its pod is gone (%v)", err)
	}
	f.pass(t, second)
	if got := f.podState(t, "web-b"); got != "terminating" {
		t.Errorf("web-b is %s once the slot is free, want terminating", got)
	}
}

// TestDrainingPassesLeaveWorkersForNewNodes: a draining node's pass waits for
// its evictions, which a loaded API server answers slowly. While the one
// drain slot's pass hangs on an eviction, another admitted node is still
// cordoned and tainted at once: the passes that protect a node do not wait
// behind the drains.
func TestDrainingPassesLeaveWorkersForNewNodes(t *testing.T) {
	f := newFixture(t, "slowevict")
	first, second := f.ns+"-a", f.ns+"-b"
	f.node(t, first)
	f.node(t, second)
	f.pod(t, "pod-a", first)
	log := f.startController(t, Options{MaxConcurrentNodes: 1})
	release := log.hold("evict " + f.ns + "/pod-a")
	defer release()
	f.deleteNode(t, first)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return log.count("evict "+f.ns+"/pod-a") == 1, nil
	}, "the first node's pass sends its eviction, which the API server holds")

	f.deleteNode(t, second)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		n := getNode(t, second)
		return n.Spec.Unschedulable && drainingTaint(n) != nil, nil
	}, "the second node is cordoned while the first node's pass waits for its eviction")

	release()
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "pod-a") == "terminating", nil
	}, "the held eviction goes through")
	f.finish(t, "pod-a")
	for _, n := range []string{first, second} {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "node %s is released", n)
	}
}

// TestDrainDeadlineNeedsNoSlot: a node waiting for a drain slot looks again
// by its drain deadline, and past it deletes its pods without a slot, as a
// deadline promises, while another node still holds the only one.
func TestDrainDeadlineNeedsNoSlot(t *testing.T) {
	f := newFixture(t, "slotdeadline")
	f.r.Opts.MaxConcurrentNodes = 1
	first, second := f.ns+"-a", f.ns+"-b"
	f.node(t, first)
	f.node(t, second, func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainTimeoutAnnotation] = "10s" })
	f.r.wakeups = make(chan event.GenericEvent, 10) // a slot given back would wake; the wait's backstop is long
	f.pod(t, "pod-a", first)
	f.pod(t, "pod-b", second)
	f.deleteNode(t, first)
	f.deleteNode(t, second)

	f.pass(t, first)
	res := f.pass(t, second)
	if got := f.podState(t, "pod-b"); got != "running" {
		t.Fatalf("pod-b is %s while the only slot is the first node's", got)
	}
	if left := getNode(t, second).DeletionTimestamp.Add(10 * time.Second).Sub(f.clock.Now()); res.RequeueAfter > left+time.Millisecond {
		t.Errorf("the waiting node looks again in %v, after its drain deadline (in %v)", res.RequeueAfter, left)
	}
	f.clock.SetTime(getNode(t, second).DeletionTimestamp.Add(11 * time.Second))
	f.pass(t, second)
	if got := f.podState(t, "pod-b"); got != "terminating" {
		t.Errorf("pod-b is %s past the drain deadline, want deleted (terminating) without a slot", got)
	}
	if got := f.podState(t, "pod-a"); got != "terminating" {
		t.Errorf("pod-a is %s, want still terminating (the first node keeps draining)", got)
	}
}

// TestNodeWaitingOnlyOnABudgetStepsAside: with one drain slot, the first node's
// only pod is under a PDB that allows no disruption (its replacements are not
// Ready). That node gives its slot to the second node, which drains, instead
// of holding every other drain behind that budget; when the PDB allows again,
// the first node's pod goes and the node is released.
func TestNodeWaitingOnlyOnABudgetStepsAside(t *testing.T) {
	f := newFixture(t, "stepaside")
	first, second := f.ns+"-a", f.ns+"-b"
	f.node(t, first)
	f.node(t, second)
	web := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }
	readyPod(t, f.pod(t, "web-a", first, web))
	f.pdb(t, "web", builder.MaxUnavailable("1"), 0, 1, 1, 2) // one replica not Ready: no disruption
	f.pod(t, "free-b", second)
	log := f.startController(t, Options{MaxConcurrentNodes: 1})
	f.deleteNode(t, first)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		c := condition(getNode(t, first), ngv1alpha1.TerminatingCondition)
		return c != nil && c.Reason == "Draining" && strings.Contains(c.Message, "under PDB "+f.ns+"/web (allows 0 disruptions"), nil
	}, "the first node drains and waits on PDB web")
	f.deleteNode(t, second)

	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "free-b") == "terminating", nil
	}, "the second node takes the slot the first node's budget wait gave up, and evicts")
	if got := f.podState(t, "web-a"); got != "running" {
		t.Fatalf("web-a is %s while its PDB allows no disruption", got)
	}
	f.finish(t, "free-b")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, second)
	}, "the second node is released")

	f.pdbStatus(t, "web", 1, 2, 1, 2) // the replacement is Ready
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "web-a") == "terminating", nil
	}, "the PDB allowing a disruption again evicts web-a")
	f.finish(t, "web-a")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, first)
	}, "the first node is released")
	if n := log.count("evict " + f.ns + "/web-a"); n > 2 {
		t.Errorf("web-a's eviction was sent %d times, want at most 2 (the PDB's status said 0)", n)
	}
}

// TestNodeQueuedBehindItsPDBStepsAside: with two drain slots, nodes a and b
// each have a pod under PDB web (which allows 2), node c one under none.
// web-a's eviction is held in flight; node b's queue goes after it (one
// eviction at a time per PDB), so node b gives its slot to node c, which
// evicts free-c while web-a's eviction is still in flight, instead of
// holding it for its PDB's turn. Once web-a's is answered, web-b's goes
// without b's slot, and every node is released.
func TestNodeQueuedBehindItsPDBStepsAside(t *testing.T) {
	f := newFixture(t, "pdbturn")
	a, b, c := f.ns+"-a", f.ns+"-b", f.ns+"-c"
	web := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }
	for _, n := range []string{a, b, c} {
		f.node(t, n)
	}
	readyPod(t, f.pod(t, "web-a", a, web))
	readyPod(t, f.pod(t, "web-b", b, web))
	f.pod(t, "free-c", c)
	f.pdb(t, "web", builder.MaxUnavailable("2"), 2, 2, 0, 2)
	log := f.startController(t, Options{MaxConcurrentNodes: 2})
	release := log.hold("evict " + f.ns + "/web-a")
	defer release()

	f.deleteNode(t, a)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return log.count("evict "+f.ns+"/web-a") > 0, nil
	}, "node a sends web-a's eviction, which the API server holds")
	f.deleteNode(t, b)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		cond := condition(getNode(t, b), ngv1alpha1.TerminatingCondition)
		return cond != nil && cond.Reason == "Draining", nil
	}, "node b takes the second slot and drains")
	f.deleteNode(t, c)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "free-c") == "terminating", nil
	}, "node b, whose only pod waits behind web-a's eviction under PDB web, gives its slot to node c, which evicts")
	if n := log.count("evict " + f.ns + "/web-b"); n != 0 {
		t.Fatalf("web-b's eviction was sent %d times while web-a's was in flight under the same PDB, want none", n)
	}
	if held := testutil.ToFloat64(slotsHeld); held != 2 {
		t.Errorf("nodeguard_drain_slots_held is %v, want 2 (a and c; b drains aside)", held)
	}

	release()
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "web-a") == "terminating" && f.podState(t, "web-b") == "terminating", nil
	}, "web-a's eviction answered, web-b's goes after it")
	for _, p := range []string{"web-a", "web-b", "free-c"} {
		f.finish(t, p)
	}
	for _, n := range []string{a, b, c} {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "node %s is released", n)
	}
	if held := testutil.ToFloat64(slotsHeld); held != 0 {
		t.Errorf("nodeguard_drain_slots_held is %v once every node is released, want 0", held)
	}
}

// TestHandedOffSlotCarriesItsStamp: a slot freed by an emptied node while
// others wait carries when it was freed to the node that takes it, until
// that node's first eviction; a slot freed with nobody waiting carries none;
// and a node that gives the slot up unused passes the stamp on.
func TestHandedOffSlotCarriesItsStamp(t *testing.T) {
	var s drainSlots
	now := time.Now()
	holder := func(name string, began int) slotHolder {
		return slotHolder{name: name, since: now.Add(time.Duration(began) * time.Second), asked: now}
	}
	a, b, c := holder("a", 0), holder("b", 1), holder("c", 2)
	s.take(1, "a", a)
	if next := s.emptied(1, "a", now); len(next) != 0 {
		t.Fatalf("a's slot, with nobody waiting, wakes %v", next)
	}
	s.take(1, "b", b)
	if _, ok := s.handedOff("b"); ok {
		t.Fatal("b took a slot nobody waited for, yet counts a handoff")
	}
	if ok, _ := s.take(1, "c", c); ok {
		t.Fatal("c took the only slot, which b holds")
	}
	freed := now.Add(time.Second)
	if next := s.emptied(1, "b", freed); !slices.Equal(next, []string{"c"}) {
		t.Fatalf("b's emptied slot wakes %v, want [c]", next)
	}
	if ok, _ := s.take(1, "c", c); !ok {
		t.Fatal("c did not take the freed slot")
	}
	s.take(1, "a", a) // a waits again (a pod turned up): c steps aside unused
	if next := s.give(1, "c", false); !slices.Equal(next, []string{"a"}) {
		t.Fatalf("c stepping aside wakes %v, want [a]", next)
	}
	s.take(1, "a", a)
	if at, ok := s.handedOff("a"); !ok || !at.Equal(freed) {
		t.Fatalf("a's handoff began %v (%v), want %v: c did not use the slot", at, ok, freed)
	}
	if _, ok := s.handedOff("a"); ok {
		t.Fatal("a handoff counted twice")
	}
}

// TestFreedSlotGoesToAWarmNode: with one drain slot, the node waiting next in
// line watches its pods while it waits; the first node's last pod going
// hands the slot over, and the second node evicts from its watch's pods
// without listing them again, counted as one slot handoff. The line having
// moved, the third node watches its pods too, and takes the slot the same
// way. No node's pod is evicted while the node before it still has one.
func TestFreedSlotGoesToAWarmNode(t *testing.T) {
	f := newFixture(t, "handoff")
	first, second, third := f.ns+"-a", f.ns+"-b", f.ns+"-c"
	for _, n := range []string{first, second, third} {
		f.node(t, n)
		f.pod(t, "pod-"+n[len(n)-1:], n)
	}
	log := f.startController(t, Options{MaxConcurrentNodes: 1})
	for _, n := range []string{first, second, third} {
		f.deleteNode(t, n)
	}
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.podState(t, "pod-a") == "terminating" && log.count("watch pods spec.nodeName="+second) > 0, nil
	}, "the first node evicts its pod, and the second, waiting for the slot, watches its pods")
	if got := f.podState(t, "pod-b"); got != "running" {
		t.Fatalf("pod-b is %s while the only slot is the first node's", got)
	}

	for i, n := range []string{second, third} {
		pod, before := "pod-"+n[len(n)-1:], "pod-"+string(rune('a'+i))
		harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
			return log.count("watch pods spec.nodeName="+n) > 0, nil
		}, "node %s, next in line, watches its pods", n)
		lists, handedOff := log.count("list pods spec.nodeName="+n), handoffs(t)
		f.finish(t, before)
		harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
			return f.podState(t, pod) == "terminating", nil
		}, "%s going hands the slot to node %s, which evicts", before, n)
		if got := log.count("list pods spec.nodeName=" + n); got != lists {
			t.Errorf("node %s's pods were listed %d more times after the handoff, want 0 (planned from its watch)", n, got-lists)
		}
		if got := handoffs(t) - handedOff; got != 1 {
			t.Errorf("nodeguard_drain_slot_handoff_seconds counted %d handoffs to %s, want 1", got, n)
		}
		if i == 0 && f.podState(t, "pod-c") != "running" {
			t.Fatal("pod-c was evicted while the second node held the only slot")
		}
	}
	f.finish(t, "pod-c")
	for _, n := range []string{first, second, third} {
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "node %s is released", n)
	}
}

// handoffs is the sample count of nodeguard_drain_slot_handoff_seconds.
func handoffs(t *testing.T) uint64 {
	t.Helper()
	return sampleCount(t, "nodeguard_drain_slot_handoff_seconds")
}

// TestSlotWakeGoesAheadOfQueuedPasses: with passes of other nodes queued, the
// pass of a node woken for a drain slot is the next a worker takes, as
// controller-runtime's priority queue (the default) serves it; the release
// of the node that freed the slot comes next, though its pod events had
// queued it before, then the rest.
func TestSlotWakeGoesAheadOfQueuedPasses(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("termination-test")
	defer q.ShutDown()
	for _, name := range []string{"emptied", "waiting-1", "waiting-2"} {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	}
	wake := func(name string) event.GenericEvent {
		return event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}}
	}
	enqueueAt(slotWakePriority).Generic(context.Background(), wake("next-in-line"), q)
	enqueueAt(releaseWakePriority).Generic(context.Background(), wake("emptied"), q)
	for _, want := range []string{"next-in-line", "emptied", "waiting-1"} {
		got, _ := q.Get()
		if got.Name != want {
			t.Errorf("a worker takes %s, want %s", got.Name, want)
		}
		q.Done(got)
	}
}

// TestEmptiedNodeIsWokenFirstForItsRelease: the pod watch telling that a
// slot holder's last pod went wakes that node's own pass, which releases it,
// through the release wake-ups (ahead of queued passes), besides handing
// the slot on; so does a node that stepped aside, and not one that never
// drained.
func TestEmptiedNodeIsWokenFirstForItsRelease(t *testing.T) {
	r := &Reconciler{Evictor: &drain.Evictor{}, Clock: clock.RealClock{}, Opts: Options{MaxConcurrentNodes: 1}}
	r.releaseWakeups = make(chan event.GenericEvent, 4)
	r.phases.set("uid-a", "node-a", phaseDrain)
	if ok, _ := r.slots.take(1, "uid-a", slotHolder{name: "node-a", since: time.Now(), asked: time.Now()}); !ok {
		t.Fatal("node-a did not take the only slot")
	}
	r.podsGone(context.Background(), "node-a")
	select {
	case e := <-r.releaseWakeups:
		if e.Object.GetName() != "node-a" {
			t.Errorf("the release wake-ups got %s, want node-a", e.Object.GetName())
		}
	default:
		t.Error("node-a's last pod went, and its release pass was not woken ahead of queued passes")
	}

	// node-b stepped aside (its last pod went by its PDB queue, with no
	// slot): its release goes first all the same. node-c never drained.
	r.phases.set("uid-b", "node-b", phaseDrain)
	r.phases.set("uid-c", "node-c", phaseDrainSlot)
	if ok, _ := r.slots.take(1, "uid-b", slotHolder{name: "node-b", since: time.Now(), asked: time.Now()}); !ok {
		t.Fatal("node-b did not take the only slot")
	}
	r.stepAside(context.Background(), "uid-b")
	r.podsGone(context.Background(), "node-b")
	r.podsGone(context.Background(), "node-c")
	var woken []string
	for len(r.releaseWakeups) > 0 {
		woken = append(woken, (<-r.releaseWakeups).Object.GetName())
	}
	if !slices.Equal(woken, []string{"node-b"}) {
		t.Errorf("release wake-ups %v, want node-b's alone (it stepped aside; node-c never drained)", woken)
	}
}
