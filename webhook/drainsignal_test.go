package webhook_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// setDrainInProgress sets the node's KEP-5683 DrainInProgress condition True,
// as of at, as its writer does.
func setDrainInProgress(at time.Time, reason, message string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue, Reason: reason, Message: message,
			LastHeartbeatTime: metav1.NewTime(at), LastTransitionTime: metav1.NewTime(at)})
	}
}

// TestDrainInProgressChargesOnlyAsAnotherWritersCondition: a drainer may
// signal its drain by DrainInProgress=True alone, with no cordon: the first
// eviction from that schedulable node charges its budgets and marks it. The
// DrainInProgress nodeguard itself writes on a drain it follows (marked by
// nodeguard.io/drain-condition-at, which names its transition) is no such
// signal: an eviction from that schedulable node is admitted with no charge.
// A condition another writer set True after nodeguard's mark (a transition of
// its own) is that writer's again, and charges.
func TestDrainInProgressChargesOnlyAsAnotherWritersCondition(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	ctx := context.Background()
	nodes := createReadyNodes(t, "drainsignal", 4)
	createBudget(t, "drainsignal", 3, builder.NDBMaxUnavailable("3"))
	other, own, retaken := nodes[0], nodes[1], nodes[2]
	h := evictionHandler(t, ngwebhook.TrafficGate{})
	at := time.Now().UTC().Truncate(time.Second)

	// The drainer's condition, with no cordon.
	patchNodeStatus(t, other, setDrainInProgress(at, "AdminRequested", "draining for maintenance"))
	// nodeguard's own, as its termination controller leaves it on a drain
	// it follows: the mark first, then the condition it names.
	patchNode(t, own, func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainConditionAnnotation] = ngv1alpha1.FormatTime(at) })
	patchNodeStatus(t, own, setDrainInProgress(at, "AdminRequested",
		"drained by upgrader; nodeguard counts it against the node's budgets"))
	// nodeguard's mark of an earlier condition, under one another writer
	// set True since.
	patchNode(t, retaken, func(n *corev1.Node) {
		n.Annotations[ngv1alpha1.DrainConditionAnnotation] = ngv1alpha1.FormatTime(at.Add(-time.Hour))
	})
	patchNodeStatus(t, retaken, setDrainInProgress(at, "AdminRequested", "draining for maintenance"))

	for _, node := range []string{own, other, retaken} {
		pod := createPod(t, node+"-pod", node)
		if resp := h.Handle(ctx, evictionReview(pod.Namespace, pod.Name, nil)); !resp.Allowed {
			t.Fatalf("eviction from %s: %+v", node, resp.Result)
		}
	}
	charged := getBudget(t, "drainsignal").Status.DisruptedNodes
	for _, node := range []string{other, retaken} {
		if _, ok := drainCharged(t, node); !ok {
			t.Errorf("the drain of %s, signalled by another writer's DrainInProgress alone, is not marked", node)
		}
		if _, ok := charged[node]; !ok {
			t.Errorf("the drain of %s is not charged to its budget: %v", node, charged)
		}
	}
	if _, ok := drainCharged(t, own); ok {
		t.Error("an eviction from a schedulable node charged its drain on the strength of nodeguard's own DrainInProgress")
	}
	if _, ok := charged[own]; ok {
		t.Errorf("the budget charges %s for nodeguard's own DrainInProgress: %v", own, charged)
	}
	if !ngv1alpha1.OwnDrainInProgress(getNode(t, own)) || ngv1alpha1.OwnDrainInProgress(getNode(t, retaken)) {
		t.Error("OwnDrainInProgress does not follow nodeguard's mark")
	}
}
