package finalizer

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// KEP-5683's reasons: a cause category, not the state (the condition's type
// and status are the state).
const (
	// LifecycleReasonAdminRequested: an admin-authorized controller set the
	// condition; here, nodeguard drains a node whose deletion it admitted.
	LifecycleReasonAdminRequested = "AdminRequested"
	// LifecycleReasonDrainCompleted: the drain's criteria are met.
	LifecycleReasonDrainCompleted = "DrainCompleted"
)

// markDrainInProgress writes KEP-5683's DrainInProgress=True when the drain
// begins (in the status write after the pass's first evictions), unless the
// node says so already. Its transition time is when the
// drain began, read back from the node on every pass, so a restart keeps it.
//
// kube-apiserver accepts these condition types whatever its
// NodeLifecycleConditions gate says (node condition types are free-form, and
// in 1.37 the gate guards no validation): nodeguard writes them everywhere.
func (r *Reconciler) markDrainInProgress(node *corev1.Node) {
	if c := nodeCondition(node, corev1.NodeDrainInProgress); c != nil && c.Status == corev1.ConditionTrue {
		return
	}
	r.stageCondition(node, corev1.NodeCondition{
		Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue, Reason: LifecycleReasonAdminRequested,
		Message: "nodeguard drains the node before its deletion",
	})
}

// markDrained writes Drained=True and DrainInProgress=False when every
// evictable pod is gone.
func (r *Reconciler) markDrained(node *corev1.Node) {
	for _, c := range []corev1.NodeCondition{
		{Type: corev1.NodeDrained, Status: corev1.ConditionTrue, Reason: LifecycleReasonDrainCompleted, Message: "every evictable pod is gone"},
		{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionFalse, Reason: LifecycleReasonDrainCompleted, Message: "every evictable pod is gone"},
	} {
		if old := nodeCondition(node, c.Type); old != nil && old.Status == c.Status {
			continue
		}
		r.stageCondition(node, c)
	}
}

// drainStarted is when the drain began: DrainInProgress's transition time,
// or now before it is written.
func (r *Reconciler) drainStarted(node *corev1.Node) time.Time {
	if c := nodeCondition(node, corev1.NodeDrainInProgress); c != nil && c.Status == corev1.ConditionTrue {
		return c.LastTransitionTime.Time
	}
	return r.Clock.Now()
}
