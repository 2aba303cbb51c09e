package autoscaler

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// The hold's side of the eviction webhook (webhook/evictionwait.go):
// cluster-autoscaler does not cordon by default, it taints and evicts at once,
// so the evictions from a tainted node are where its drain is held until the
// hold (hold.go) lets the scale-down go.

// ScaleDownHeld reports whether the node carries cluster-autoscaler's
// scale-down taint and nodeguard's hold (--cluster-autoscaler-scale-down-hold)
// has not let the scale-down go yet: its budget claim is not made, or the
// node's traffic cut is not confirmed (nodeguard's delay-deletion annotation
// is still on; HoldReconciler removes it once both are done, or past
// --admin-state-timeout). Its evictions must wait, or a scale-down the
// budgets refuse would drain the node all the same, and its pods would go
// while the load balancer still sends them connections. cluster-autoscaler
// retries a refused eviction every 10 s for --max-pod-eviction-time (2 min),
// then abandons the scale-down and removes its taint.
func ScaleDownHeld(node *corev1.Node, signals *ngv1alpha1.Signals) bool {
	if !ngv1alpha1.ScaleDownTainted(node) || !signals.ScaleDownClaims() || otherSignal(node, signals) {
		return false
	}
	_, holding := node.Annotations[ngv1alpha1.DelayDeletionAnnotation]
	return !ScaleDownClaimed(node) || holding
}

// ScaleDownClaimed reports whether the hold charged the node's scale-down to
// its budgets (its mark, ngv1alpha1.ScaleDownClaimedAnnotation).
func ScaleDownClaimed(node *corev1.Node) bool {
	_, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
	return claimed
}

// UnclaimedRefusal says why an eviction from a node whose scale-down is not
// charged yet waits (a 429): the drainer retries, and the hold's claim ends
// the wait or the scale-down.
func UnclaimedRefusal(node *corev1.Node) string {
	return fmt.Sprintf("cluster-autoscaler's scale-down of node %s is not admitted by its NodeDisruptionBudgets yet (nodeguard claims it when the node is tainted %s); retry: "+
		"a scale-down the budgets keep refusing fails its drain, and cluster-autoscaler keeps the node", node.Name, ngv1alpha1.ClusterAutoscalerTaintKey)
}

// otherSignal reports whether the node carries a signal taint besides
// cluster-autoscaler's that charges nothing (an out-of-service, shutdown or
// spot-evicted node): such a node cannot wait for a scale-down's hold.
func otherSignal(node *corev1.Node, signals *ngv1alpha1.Signals) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
		_, signal := signals.Of(t)
		return signal && t.Key != ngv1alpha1.ClusterAutoscalerTaintKey && !signals.AwaitsDisruptionClaim(node, t)
	})
}
