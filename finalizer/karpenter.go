package finalizer

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// releaseToKarpenter is the last phase of a node Karpenter (or AKS node
// auto-provisioning) terminates (karpenter.Finalized): its
// karpenter.sh/termination finalizer drains the node and deletes the
// instance, so nodeguard only cuts the traffic: a second drain would evict
// the same pods twice, and Karpenter ignores other finalizers' progress
// anyway. It removes nodeguard's finalizer once the traffic cut is
// confirmed or timed out (cutTraffic), leaving the drain to Karpenter.
func (r *Reconciler) releaseToKarpenter(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	return r.releaseSaying(ctx, node, ReasonReleasedToKarpenter, fmt.Sprintf(
		"released the node to Karpenter, whose %s finalizer drains it and deletes its instance,", ngv1alpha1.KarpenterTerminationFinalizer))
}
