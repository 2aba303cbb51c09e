package finalizer

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// karpenterOwned reports whether Karpenter (or AKS node auto-provisioning)
// terminates the node: its karpenter.sh/termination finalizer drains the node
// and deletes the instance. nodeguard then only cuts the traffic: a second
// drain would evict the same pods twice, and Karpenter ignores other
// finalizers' progress anyway.
func karpenterOwned(node *corev1.Node) bool {
	return slices.Contains(node.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer)
}

// releaseToKarpenter removes nodeguard's finalizer once the traffic cut is
// confirmed or timed out (cutTraffic), leaving the drain to Karpenter.
func (r *Reconciler) releaseToKarpenter(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	r.event(node, corev1.EventTypeNormal, ReasonReleasedToKarpenter,
		"traffic cut: releasing the node to Karpenter, whose %s finalizer drains it and deletes its instance", ngv1alpha1.KarpenterTerminationFinalizer)
	return r.removeFinalizer(ctx, node)
}
