package finalizer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// followOutside has the fixture follow outside drains, charging them to
// budgets through a claimer on the test's API server.
func (f *fixture) followOutside() {
	claimer := &budget.Claimer{Client: env.Client, Reader: env.Client, Clock: f.clock}
	f.r.Outside = &OutsideDrains{Rule: &budget.Rule{Claimer: claimer, Budgets: env.Client, Clock: f.clock}, Managed: labels.Everything()}
}

// countedBudget creates a budget over the nodes labelled pool=name with its
// status as the status controller would write it (none runs here).
func countedBudget(t *testing.T, name string, expected, maxUnavailable int32) {
	t.Helper()
	ctx := context.Background()
	ndb := builder.NDB(name, builder.NDBSelecting("pool", name), builder.NDBMaxUnavailable(fmt.Sprint(maxUnavailable)))
	harness.MustCreate(t, env.Client, ndb)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
	ndb.Status = ngv1alpha1.NodeDisruptionBudgetStatus{ObservedGeneration: ndb.Generation, ExpectedNodes: expected,
		CurrentAvailable: expected, DesiredAvailable: expected - maxUnavailable, DisruptionsAllowed: maxUnavailable}
	if err := env.Client.Status().Update(ctx, ndb); err != nil {
		t.Fatal(err)
	}
}

func disruptedNodes(t *testing.T, name string) map[string]metav1.Time {
	t.Helper()
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &ndb); err != nil {
		t.Fatal(err)
	}
	return ndb.Status.DisruptedNodes
}

func patchNode(t *testing.T, name string, change func(*corev1.Node)) {
	t.Helper()
	node := getNode(t, name)
	patch := client.MergeFrom(node.DeepCopy())
	change(node)
	if err := env.Client.Patch(context.Background(), node, patch); err != nil {
		t.Fatal(err)
	}
}

// markCharged does what the eviction webhook does at a drain's first
// eviction: charge the node's budgets, then mark the node.
func (f *fixture) markCharged(t *testing.T, name, by string) {
	t.Helper()
	v, err := f.r.Outside.Rule.Decide(context.Background(), getNode(t, name), false)
	if err != nil || !v.Allowed {
		t.Fatalf("charging the drain of %s: %+v, %v", name, v, err)
	}
	patchNode(t, name, func(n *corev1.Node) {
		n.Annotations[ngv1alpha1.DrainChargedAtAnnotation] = ngv1alpha1.FormatTime(f.clock.Now())
		n.Annotations[ngv1alpha1.DrainedByAnnotation] = by
	})
}

// TestFollowedDrainIsCutThenGivenBack follows a drain someone else runs on a
// charged node: its backend entries go Down and the cut is recorded (which the
// eviction webhook waits for); DrainInProgress names the drainer and Drained
// follows its last pod; once the node is uncordoned (and Ready), the budget
// gets its disruption back and the marks go.
func TestFollowedDrainIsCutThenGivenBack(t *testing.T) {
	f := newFixture(t, "followed")
	f.followOutside()
	n := newAzureNode(f, 0)
	emu := f.withAzure(t, armemulator.Topology{}, 0, n)
	f.azureNode(t, n, builder.WithLabels("pool", f.ns))
	countedBudget(t, f.ns, 2, 1)
	f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
	patchNode(t, n.name, func(node *corev1.Node) { node.Spec.Unschedulable = true })
	f.markCharged(t, n.name, "upgrader")

	f.passUntil(t, n.name, func() bool {
		c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition)
		return c != nil && c.Status == corev1.ConditionTrue
	}, "the followed drain's traffic cut is recorded (TrafficCut True)")
	for pool, state := range entryStates(emu, n.name) {
		if state != "Down" {
			t.Errorf("entry in %s is %s once the cut is recorded", pool, state)
		}
	}
	f.pass(t, n.name)
	c := condition(getNode(t, n.name), corev1.NodeDrainInProgress)
	if c == nil || c.Status != corev1.ConditionTrue || !strings.Contains(c.Message, "upgrader") {
		t.Fatalf("DrainInProgress = %+v, want True naming the drainer", c)
	}

	f.finish(t, "web") // the drainer's eviction, confirmed
	f.pass(t, n.name)
	if c := condition(getNode(t, n.name), corev1.NodeDrained); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("Drained = %+v once the last pod went", c)
	}
	if len(f.events.with(ReasonOutsideDrained)) != 1 {
		t.Errorf("events %s: %v", ReasonOutsideDrained, f.events.with(ReasonOutsideDrained))
	}

	patchNode(t, n.name, func(node *corev1.Node) { node.Spec.Unschedulable = false }) // kubectl uncordon
	f.pass(t, n.name)
	node := getNode(t, n.name)
	if _, charged := ngv1alpha1.DrainCharged(node); charged || condition(node, ngv1alpha1.TrafficCutCondition) != nil {
		t.Fatalf("marks left after the node came back: %v, %+v", node.Annotations, node.Status.Conditions)
	}
	if got := disruptedNodes(t, f.ns); len(got) != 0 {
		t.Errorf("the budget still charges %v", got)
	}
	if c := condition(node, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("DrainInProgress = %+v after the node came back", c)
	}
	if len(f.events.with(ReasonDrainEnded)) != 1 {
		t.Errorf("events %s: %v", ReasonDrainEnded, f.events.with(ReasonDrainEnded))
	}
	// Given back at once: left to the status controller, a short drain's
	// claim would read as a forged review (DisruptionClaimUnconfirmed).
	if _, kept := disruptedNodes(t, f.ns)["unfollowed-back"]; kept {
		t.Errorf("the budget still charges the node that came back: %v", disruptedNodes(t, f.ns))
	}
}

// TestChargedDrainEndsWhenOutsideDrainsAreNoLongerFollowed: an operator sets
// --outside-drains=false in the middle of an upgrade whose drains nodeguard
// had charged. A node that comes back (uncordoned, Ready) loses nodeguard's
// drain marks all the same and its claim is given back, so that its budgets
// count it available again and its traffic is restored; a node still
// cordoned keeps them until it comes back.
func TestChargedDrainEndsWhenOutsideDrainsAreNoLongerFollowed(t *testing.T) {
	f := newFixture(t, "unfollowed")
	f.followOutside()
	for _, name := range []string{"unfollowed-back", "unfollowed-cordoned"} {
		f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
		patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
	}
	countedBudget(t, f.ns, 2, 2)
	f.markCharged(t, "unfollowed-back", "upgrader")
	f.markCharged(t, "unfollowed-cordoned", "upgrader")
	f.r.Outside.Off = true // restarted with --outside-drains=false

	patchNode(t, "unfollowed-back", func(n *corev1.Node) { n.Spec.Unschedulable = false }) // the upgrade's uncordon
	f.pass(t, "unfollowed-back")
	f.pass(t, "unfollowed-cordoned")
	if node := getNode(t, "unfollowed-back"); node.Annotations[ngv1alpha1.DrainChargedAtAnnotation] != "" {
		t.Errorf("the node that came back keeps its drain mark: %v", node.Annotations)
	}
	if unavailable, why := budget.Unavailable(getNode(t, "unfollowed-back"), nil); unavailable {
		t.Errorf("the node that came back still counts unavailable to its budgets (%s)", why)
	}
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, "unfollowed-cordoned")); !charged {
		t.Errorf("the node still cordoned lost its drain mark")
	}
	if len(f.events.with(ReasonDrainEnded)) != 1 {
		t.Errorf("events %s: %v", ReasonDrainEnded, f.events.with(ReasonDrainEnded))
	}
}

// TestDrainFoundUnderWayIsCharged: drains that began while nodeguard was not
// answering evictions are charged when the controller sees them: a cordoned
// node with a pod the Eviction API is deleting, within the budget; a second
// one (DrainInProgress written by its drainer) over the budget is said in a
// Warning and left uncharged. A cordoned node that shows no drain is left to
// its first eviction.
func TestDrainFoundUnderWayIsCharged(t *testing.T) {
	f := newFixture(t, "found")
	f.followOutside()
	for _, name := range []string{"found-a", "found-b", "found-c"} {
		f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
		patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
	}
	countedBudget(t, f.ns, 3, 1)

	pod := f.pod(t, "evicted", "found-a", controlledBy("ReplicaSet"))
	if err := env.Client.SubResource("eviction").Create(context.Background(), pod, &policyv1.Eviction{}); err != nil {
		t.Fatal(err)
	}
	res := f.pass(t, "found-c")
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, "found-c")); charged {
		t.Fatal("a cordoned node that shows no drain was charged")
	}
	if res.RequeueAfter <= 0 {
		// kubectl drain cordons, then evicts: the cordon's pass comes
		// first, and an eviction that passed the webhook by wakes nothing.
		t.Errorf("a cordoned node that shows no drain yet is not looked at again (result %+v)", res)
	}
	f.clock.Step(pickUpWindow)
	if res := f.pass(t, "found-c"); res.RequeueAfter > 0 {
		t.Errorf("a node left cordoned %s with no drain is still looked at every %s", pickUpWindow, res.RequeueAfter)
	}
	f.pass(t, "found-a")
	if by, charged := ngv1alpha1.DrainCharged(getNode(t, "found-a")); !charged || !strings.Contains(by, "evicted") {
		t.Fatalf("the drain under way on found-a was not charged (by %q)", by)
	}
	if _, ok := disruptedNodes(t, f.ns)["found-a"]; !ok {
		t.Fatalf("the budget does not charge found-a: %v", disruptedNodes(t, f.ns))
	}

	if err := env.Client.Status().Update(context.Background(), getNodeWithDrainCondition(t, "found-b")); err != nil {
		t.Fatal(err)
	}
	f.pass(t, "found-b")
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, "found-b")); charged {
		t.Fatal("a drain over the budget was charged")
	}
	if w := f.events.with(ReasonDrainOverBudget); len(w) != 1 || !strings.Contains(w[0], "allows no more disruptions") {
		t.Fatalf("events %s: %v", ReasonDrainOverBudget, w)
	}
}

// getNodeWithDrainCondition reads the node with DrainInProgress=True added,
// as its drainer writes it.
func getNodeWithDrainCondition(t *testing.T, name string) *corev1.Node {
	t.Helper()
	node := getNode(t, name)
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
		Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue, Reason: "AdminRequested", Message: "draining for maintenance"})
	return node
}

// setDrainerCondition writes the node's DrainInProgress as its drainer (another
// writer than nodeguard) does.
func setDrainerCondition(t *testing.T, name string, status corev1.ConditionStatus, reason, message string) {
	t.Helper()
	node := getNode(t, name)
	c := corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: status, Reason: reason, Message: message}
	if old := condition(node, corev1.NodeDrainInProgress); old != nil {
		*old = c
	} else {
		node.Status.Conditions = append(node.Status.Conditions, c)
	}
	if err := env.Client.Status().Update(context.Background(), node); err != nil {
		t.Fatal(err)
	}
}

// TestDrainSignalledByConditionAloneLastsAsLongAsIt: a drainer signals its
// drain by DrainInProgress=True alone, with no cordon, and the eviction
// webhook charged it at its first eviction. The node is schedulable and
// Ready, yet the follower keeps the drain (charged, marked) across its
// passes, and leaves the drainer's condition as the drainer wrote it (no
// Drained of its own either once the pods are gone). When the drainer sets
// DrainInProgress False, the next pass gives the charge back and removes the
// marks, and the drainer's condition still stands as the drainer wrote it.
func TestDrainSignalledByConditionAloneLastsAsLongAsIt(t *testing.T) {
	f := newFixture(t, "signalled")
	f.followOutside()
	f.r.Outside.UnconfirmedTimeout = testUnconfirmedTimeout
	name := "signalled-a"
	f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
	countedBudget(t, f.ns, 2, 1)
	f.pod(t, "web-a", name, controlledBy("ReplicaSet"))
	f.pod(t, "api-a", name, controlledBy("ReplicaSet"))
	setDrainerCondition(t, name, corev1.ConditionTrue, "AdminRequested", "draining for maintenance")
	f.markChargedFor(t, name, "maintainer", "web-a") // its first eviction

	drainerKept := func(when string, status corev1.ConditionStatus, reason, message string) {
		t.Helper()
		c := condition(getNode(t, name), corev1.NodeDrainInProgress)
		if c == nil || c.Status != status || c.Reason != reason || c.Message != message {
			t.Fatalf("%s: DrainInProgress = %+v, want the drainer's own (%s, %s, %q)", when, c, status, reason, message)
		}
	}
	for i := range 4 {
		f.pass(t, name)
		node := getNode(t, name)
		if _, charged := ngv1alpha1.DrainCharged(node); !charged {
			t.Fatalf("pass %d: the drain signalled by the drainer's DrainInProgress was ended while the condition stands: %v", i, node.Annotations)
		}
		if _, ok := disruptedNodes(t, f.ns)[name]; !ok {
			t.Fatalf("pass %d: the budget no longer charges the drain: %v", i, disruptedNodes(t, f.ns))
		}
		if unavailable, why := budget.Unavailable(node, nil); !unavailable {
			t.Fatalf("pass %d: the drained node counts available (%s)", i, why)
		}
		drainerKept("while the drain goes on", corev1.ConditionTrue, "AdminRequested", "draining for maintenance")
		if i == 1 {
			f.finish(t, "web-a") // the drainer's evictions
		}
		if i == 2 {
			f.finish(t, "api-a")
		}
		f.clock.Step(testUnconfirmedTimeout) // no confirmation is owed by a drain its drainer says goes on
	}
	node := getNode(t, name)
	if c := condition(node, corev1.NodeDrained); c != nil {
		t.Errorf("nodeguard wrote Drained on a drain whose conditions are its drainer's: %+v", c)
	}
	if _, marked := node.Annotations[ngv1alpha1.DrainConditionAnnotation]; marked {
		t.Errorf("nodeguard marked conditions of its own on a drain whose conditions are its drainer's: %v", node.Annotations)
	}
	if len(f.events.with(ReasonOutsideDrained)) != 1 {
		t.Errorf("events %s: %v, want one once the pods were gone", ReasonOutsideDrained, f.events.with(ReasonOutsideDrained))
	}
	if len(f.events.with(ReasonDrainEnded)) != 0 || len(f.events.with(ReasonDrainWithdrawn)) != 0 {
		t.Errorf("the drain ended or was withdrawn while its drainer's condition stood: %v %v",
			f.events.with(ReasonDrainEnded), f.events.with(ReasonDrainWithdrawn))
	}

	setDrainerCondition(t, name, corev1.ConditionFalse, "MaintenanceDone", "back in service")
	f.pass(t, name)
	node = getNode(t, name)
	for _, key := range drainMarks {
		if _, left := node.Annotations[key]; left {
			t.Errorf("the ended drain left %s on the node: %v", key, node.Annotations)
		}
	}
	if got := disruptedNodes(t, f.ns); len(got) != 0 {
		t.Errorf("the budget still charges %v after the drainer set DrainInProgress False", got)
	}
	drainerKept("after the drain ended", corev1.ConditionFalse, "MaintenanceDone", "back in service")
	if len(f.events.with(ReasonDrainEnded)) != 1 {
		t.Errorf("events %s: %v", ReasonDrainEnded, f.events.with(ReasonDrainEnded))
	}
	f.pass(t, name)
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, name)); charged {
		t.Error("the ended drain was charged again")
	}
}

// TestOwnDrainConditionIsNoDrainSignal: nodeguard writes DrainInProgress=True
// itself on the cordoned drains it follows. That condition is told from
// another writer's: once the node is uncordoned the drain ends, and the
// condition nodeguard set False leaves nothing that looks drained by someone
// else; and a node left with nodeguard's own DrainInProgress=True but no
// charge (its charge marks removed by hand, docs/security.md's break-glass)
// is not charged again on the strength of that condition.
func TestOwnDrainConditionIsNoDrainSignal(t *testing.T) {
	f := newFixture(t, "owncond")
	f.followOutside()
	ctx := context.Background()
	ended, stripped := "owncond-ended", "owncond-stripped"
	for _, name := range []string{ended, stripped} {
		f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
		patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
		f.pod(t, "web-"+name, name, controlledBy("ReplicaSet"))
	}
	countedBudget(t, f.ns, 2, 2)
	for _, name := range []string{ended, stripped} {
		f.markCharged(t, name, "upgrader")
		f.pass(t, name)
		node := getNode(t, name)
		if c := condition(node, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("%s: DrainInProgress = %+v, want nodeguard's True", name, c)
		}
		if !ngv1alpha1.OwnDrainInProgress(node) || ngv1alpha1.DrainInProgressByOther(node) {
			t.Errorf("%s: nodeguard's DrainInProgress is not told as its own: %v %+v", name, node.Annotations, node.Status.Conditions)
		}
	}

	// kubectl uncordon: the drain ends at once.
	patchNode(t, ended, func(n *corev1.Node) { n.Spec.Unschedulable = false })
	f.pass(t, ended)
	node := getNode(t, ended)
	if _, charged := ngv1alpha1.DrainCharged(node); charged {
		t.Fatalf("the uncordoned node's drain did not end (nodeguard's own DrainInProgress taken for a drainer's): %v", node.Annotations)
	}
	if c := condition(node, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionFalse || c.Reason != LifecycleReasonUncordoned {
		t.Errorf("DrainInProgress = %+v after the node came back, want nodeguard's False", c)
	}
	if _, left := node.Annotations[ngv1alpha1.DrainConditionAnnotation]; left {
		t.Errorf("the mark of nodeguard's conditions outlived the drain: %v", node.Annotations)
	}
	if ngv1alpha1.DrainInProgressByOther(node) || f.r.followed(node) {
		t.Error("the node that came back looks drained by someone else")
	}
	f.pass(t, ended)
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, ended)); charged {
		t.Error("the node that came back was charged again")
	}

	// The charge's marks removed by hand, and its claim given back:
	// nodeguard's DrainInProgress=True is left on the cordoned node.
	budgets, err := budget.Matching(ctx, env.Client, getNode(t, stripped))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.r.Outside.Rule.Claimer.ReleaseAll(ctx, budgets, stripped); err != nil {
		t.Fatal(err)
	}
	patchNode(t, stripped, func(n *corev1.Node) {
		delete(n.Annotations, ngv1alpha1.DrainChargedAtAnnotation)
		delete(n.Annotations, ngv1alpha1.DrainedByAnnotation)
	})
	for range 2 {
		f.pass(t, stripped)
		f.clock.Step(time.Second)
	}
	node = getNode(t, stripped)
	if by, charged := ngv1alpha1.DrainCharged(node); charged {
		t.Errorf("a node was charged on the strength of nodeguard's own DrainInProgress (by %q)", by)
	}
	if _, ok := disruptedNodes(t, f.ns)[stripped]; ok {
		t.Errorf("the budget charges %s for nodeguard's own DrainInProgress: %v", stripped, disruptedNodes(t, f.ns))
	}
	if len(f.events.with(ReasonDrainFound)) != 0 {
		t.Errorf("events %s: %v", ReasonDrainFound, f.events.with(ReasonDrainFound))
	}
}
