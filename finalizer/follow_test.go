package finalizer

import (
	"context"
	"fmt"
	"strings"
	"testing"

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
