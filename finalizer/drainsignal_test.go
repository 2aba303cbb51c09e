package finalizer

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
)

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
