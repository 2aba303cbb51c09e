package finalizer

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
)

// TestQuarantinedDrainIsGivenUp: an AKS upgrade (undrainableNodeBehavior
// Cordon) drains a node whose pod cannot go, and past its drain timeout labels
// the node Quarantined and goes on, leaving it cordoned with its pod. The
// next pass ends the drain: its budget room back, its entries None again, a
// Warning naming why. The node stays cordoned and is not picked up again by
// the pod the upgrade evicted before; a later drain is charged anew, and the
// label, already there, does not end it. Uncordoned, the node loses the mark.
func TestQuarantinedDrainIsGivenUp(t *testing.T) {
	f := newFixture(t, "quarantine")
	f.followOutside()
	n := newAzureNode(f, 0)
	f.withAzure(t, armemulator.Topology{}, 0, n) // the cut the drain waits for
	f.azureNode(t, n, builder.WithLabels("pool", f.ns))
	countedBudget(t, f.ns, 2, 1)
	f.pod(t, "stuck", n.name, controlledBy("ReplicaSet"))
	patchNode(t, n.name, func(node *corev1.Node) { node.Spec.Unschedulable = true }) // the upgrade's cordon
	f.markCharged(t, n.name, "aks-upgrade")
	f.passUntil(t, n.name, func() bool {
		c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition)
		return c != nil && c.Status == corev1.ConditionTrue
	}, "the drain's traffic cut is recorded")

	patchNode(t, n.name, func(node *corev1.Node) {
		node.Labels[ngv1alpha1.UpgradeStatusLabel] = ngv1alpha1.UpgradeQuarantined
	})
	f.pass(t, n.name)
	node := getNode(t, n.name)
	if _, charged := ngv1alpha1.DrainCharged(node); charged || !givenUpMarked(node) {
		t.Fatalf("the quarantined node's drain was not given up: %v", node.Annotations)
	}
	if got := disruptedNodes(t, f.ns); len(got) != 0 {
		t.Errorf("the budget still charges %v", got)
	}
	if unavailable, why := budget.Unavailable(node, nil); unavailable {
		t.Errorf("the quarantined node still counts unavailable (%s): its budget has no room back", why)
	}
	if !node.Spec.Unschedulable {
		t.Error("nodeguard uncordoned the quarantined node: that is AKS's or the operator's call")
	}
	if c := condition(node, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionFalse || c.Reason != LifecycleReasonGivenUp {
		t.Errorf("DrainInProgress = %+v, want False (%s)", c, LifecycleReasonGivenUp)
	}
	if w := f.events.with(ReasonDrainGivenUp); len(w) != 1 || !strings.Contains(w[0], "Quarantined") || !strings.Contains(w[0], "aks-upgrade") {
		t.Errorf("events %s: %v", ReasonDrainGivenUp, w)
	}

	// The upgrade's evicted pod still terminating is no drain to pick up.
	f.pass(t, n.name)
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, n.name)); charged {
		t.Fatal("the given-up drain was picked up again")
	}

	// A later drain's first eviction charges it anew; the label it still
	// carries does not end that drain.
	f.markCharged(t, n.name, "kubernetes-admin")
	f.pass(t, n.name)
	if by, charged := ngv1alpha1.DrainCharged(getNode(t, n.name)); !charged || by != "kubernetes-admin" {
		t.Fatalf("the later drain was ended by the old quarantine label (charged %v by %q)", charged, by)
	}

	// Uncordoned and Ready: that drain ends, and the given-up mark goes.
	patchNode(t, n.name, func(node *corev1.Node) { node.Spec.Unschedulable = false })
	f.pass(t, n.name)
	f.pass(t, n.name)
	if node := getNode(t, n.name); givenUpMarked(node) {
		t.Errorf("the given-up mark outlived the node's uncordon: %v", node.Annotations)
	}
}

// TestDrainConditionWithdrawnIsGivenUp: a KEP-5683 drainer cordons the node,
// writes DrainInProgress=True and evicts; then it gives up and removes its
// condition, leaving the node cordoned. The drain ends as a quarantined one
// does. A drainer that sets DrainInProgress False with Drained=True finished:
// that drain stays charged until the node is back.
func TestDrainConditionWithdrawnIsGivenUp(t *testing.T) {
	f := newFixture(t, "withdrawn")
	f.followOutside()
	for _, name := range []string{"withdrawn-a", "withdrawn-b"} {
		f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
		patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
		setDrainerCondition(t, name, corev1.ConditionTrue, "AdminRequested", "draining for maintenance")
	}
	countedBudget(t, f.ns, 2, 2)
	for _, name := range []string{"withdrawn-a", "withdrawn-b"} {
		f.markCharged(t, name, "maintainer")
		f.pass(t, name)
		if _, seen := getNode(t, name).Annotations[ngv1alpha1.DrainConditionSeenAtAnnotation]; !seen {
			t.Fatalf("%s: the drainer's DrainInProgress was not noted", name)
		}
	}

	node := getNode(t, "withdrawn-a")
	node.Status.Conditions = removeCondition(node.Status.Conditions, corev1.NodeDrainInProgress)
	if err := env.Client.Status().Update(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	f.pass(t, "withdrawn-a")
	if node := getNode(t, "withdrawn-a"); !givenUpMarked(node) || node.Annotations[ngv1alpha1.DrainChargedAtAnnotation] != "" {
		t.Errorf("the drain whose condition its drainer removed was not given up: %v", node.Annotations)
	}
	if w := f.events.with(ReasonDrainGivenUp); len(w) != 1 || !strings.Contains(w[0], "DrainInProgress") {
		t.Errorf("events %s: %v", ReasonDrainGivenUp, w)
	}

	setDrainerCondition(t, "withdrawn-b", corev1.ConditionFalse, "Completed", "drained")
	node = getNode(t, "withdrawn-b")
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeDrained, Status: corev1.ConditionTrue, Reason: "Completed"})
	if err := env.Client.Status().Update(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	f.pass(t, "withdrawn-b")
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, "withdrawn-b")); !charged {
		t.Error("a drain its drainer finished (Drained=True) was ended while the node is still cordoned")
	}
}

func removeCondition(cs []corev1.NodeCondition, typ corev1.NodeConditionType) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, c := range cs {
		if c.Type != typ {
			out = append(out, c)
		}
	}
	return out
}
