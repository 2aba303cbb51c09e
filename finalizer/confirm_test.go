package finalizer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
)

// testUnconfirmedTimeout is --unconfirmed-claim-timeout here (its default).
const testUnconfirmedTimeout = budget.DefaultUnconfirmedClaimTimeout

// markChargedFor does what the eviction webhook does at a drain's first
// eviction, for the eviction of pod: charge the node's budgets, then mark it.
func (f *fixture) markChargedFor(t *testing.T, name, by, pod string) {
	t.Helper()
	f.markCharged(t, name, by)
	patchNode(t, name, func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainFirstEvictionAnnotation] = f.ns + "/" + pod })
}

// TestUnconfirmedDrainChargeIsWithdrawn: an eviction review posted to the
// webhook port by anyone but the API server charges a cordoned node's budgets
// and marks it, and no eviction follows. The controller withdraws such a
// charge --unconfirmed-claim-timeout after the review (or after the drainer's
// last retry, which renews it): marks gone, disruption given back, a Warning
// and a count. A charge whose eviction the API server carried out (its pod
// evicted, or gone) is confirmed and kept.
func TestUnconfirmedDrainChargeIsWithdrawn(t *testing.T) {
	f := newFixture(t, "unconfirmed")
	f.followOutside()
	f.r.Outside.UnconfirmedTimeout = testUnconfirmedTimeout
	nodes := []string{"unconfirmed-forged", "unconfirmed-evicted", "unconfirmed-gone"}
	for _, name := range nodes {
		f.node(t, name, builder.Ready(), builder.WithLabels("pool", f.ns))
		patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
		f.pod(t, "web-"+name, name, controlledBy("ReplicaSet"))
	}
	countedBudget(t, f.ns, 3, 3)
	withdrawnBefore := testutil.ToFloat64(drainChargesWithdrawn)
	for _, name := range nodes {
		f.markChargedFor(t, name, "system:serviceaccount:tenant:forger", "web-"+name)
	}
	// The API server carries out one drain's eviction; another drainer's pod
	// is gone before nodeguard looks.
	evicted := &corev1.Pod{}
	evicted.Namespace, evicted.Name = f.ns, "web-unconfirmed-evicted"
	if err := env.Client.SubResource("eviction").Create(context.Background(), evicted, &policyv1.Eviction{}); err != nil {
		t.Fatal(err)
	}
	f.finish(t, "web-unconfirmed-gone")

	for _, name := range nodes {
		res := f.pass(t, name)
		if name == "unconfirmed-forged" && (res.RequeueAfter <= 0 || res.RequeueAfter > testUnconfirmedTimeout) {
			t.Errorf("an unconfirmed charge is not looked at again by its deadline (result %+v)", res)
		}
	}
	for _, name := range nodes[1:] {
		if _, confirmed := getNode(t, name).Annotations[ngv1alpha1.DrainConfirmedAtAnnotation]; !confirmed {
			t.Errorf("the drain of %s, whose eviction was carried out, is not confirmed", name)
		}
	}

	// The drainer retries behind a 429: its review renews the charge.
	f.clock.Step(testUnconfirmedTimeout - time.Second)
	patchNode(t, nodes[0], func(n *corev1.Node) {
		n.Annotations[ngv1alpha1.DrainAskedAtAnnotation] = ngv1alpha1.FormatTime(f.clock.Now())
	})
	f.clock.Step(2 * time.Second)
	f.pass(t, nodes[0])
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, nodes[0])); !charged {
		t.Fatal("a charge its drainer asked again for was withdrawn before its renewed deadline")
	}

	f.clock.Step(testUnconfirmedTimeout)
	for _, name := range nodes {
		f.pass(t, name)
	}
	node := getNode(t, nodes[0])
	for _, key := range drainMarks {
		if _, left := node.Annotations[key]; left {
			t.Errorf("the withdrawn drain left %s on the node: %v", key, node.Annotations)
		}
	}
	if unavailable, why := budget.Unavailable(node, nil); unavailable {
		t.Errorf("the node of the withdrawn charge counts unavailable (%s)", why)
	}
	charged := disruptedNodes(t, f.ns)
	if _, kept := charged[nodes[0]]; kept || len(charged) != 2 {
		t.Errorf("the budget charges %v, want the two confirmed drains only", charged)
	}
	for _, name := range nodes[1:] {
		if _, ok := ngv1alpha1.DrainCharged(getNode(t, name)); !ok {
			t.Errorf("the confirmed drain of %s lost its mark", name)
		}
	}
	if w := f.events.with(ReasonDrainWithdrawn); len(w) != 1 || !strings.Contains(w[0], "forger") {
		t.Errorf("events %s: %v, want one naming the drainer", ReasonDrainWithdrawn, w)
	}
	if got := testutil.ToFloat64(drainChargesWithdrawn) - withdrawnBefore; got != 1 {
		t.Errorf("nodeguard_drain_charges_withdrawn_total rose by %v, want 1", got)
	}

	// Still cordoned and showing no drain: not charged again.
	f.pass(t, nodes[0])
	if _, charged := ngv1alpha1.DrainCharged(getNode(t, nodes[0])); charged {
		t.Error("the withdrawn drain was charged again with no eviction")
	}
}
