package finalizer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// InstanceChecker says whether a node's cloud instance still exists (the
// Azure admin-state manager asks ARM for the node's VM).
type InstanceChecker interface {
	InstanceExists(ctx context.Context, node *corev1.Node) (bool, error)
}

// instanceGone reports whether a terminating node is not Ready and its VM no
// longer exists (the cloud node lifecycle controller's case, or a VM deleted
// under a drain): no kubelet will finish its pods and there is no traffic to
// cut. A Ready node is not asked about; an error counts as "exists".
func (r *Reconciler) instanceGone(ctx context.Context, node *corev1.Node) bool {
	if r.Instances == nil || nodeReady(node) {
		return false
	}
	exists, err := r.Instances.InstanceExists(ctx, node)
	if err != nil {
		logf.FromContext(ctx).Error(err, "Asking whether the node's VM exists; terminating it as usual", "node", node.Name)
		return false
	}
	return !exists
}

// releaseGone lets a node whose VM is gone go at once: no Lease, no cordon,
// no traffic cut, no drain. The pod garbage collector deletes its pods once
// the node is gone.
func (r *Reconciler) releaseGone(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	r.event(node, corev1.EventTypeNormal, ReasonInstanceGone,
		"the node is not Ready and its VM %s no longer exists: releasing it at once, without a drain; the pod garbage collector removes its pods", node.Spec.ProviderID)
	return r.removeFinalizer(ctx, node)
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
