package karpenter

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// MarkDenied records on the node when its NodeClaim's delete was first
// denied (kept while the denials go on), and what denied it last. It does not
// wait for the node to show Karpenter's disrupted taint: Karpenter taints a
// candidate a moment before it deletes the NodeClaim, and the node read from
// a cache may not show the taint yet. A failure is logged: the next retry's
// denial writes the mark again.
func MarkDenied(ctx context.Context, c client.Client, node *corev1.Node, by string, now time.Time) {
	_, marked := ngv1alpha1.AnnotationTime(node, ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation)
	if marked && node.Annotations[ngv1alpha1.NodeClaimDeleteDeniedByAnnotation] == by {
		return
	}
	patch := client.MergeFrom(node.DeepCopy())
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	if !marked {
		node.Annotations[ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation] = ngv1alpha1.FormatTime(now)
	}
	node.Annotations[ngv1alpha1.NodeClaimDeleteDeniedByAnnotation] = by
	if err := c.Patch(ctx, node, patch); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "Marking the NodeClaim delete denied", "node", node.Name)
	}
}

// MarkCharged records on the node that its NodeClaim's deletion was charged
// to its budgets: Karpenter deletes the Node only after the NodeClaim's
// finalizer ran, which a backlog or a leader change can delay past
// --unconfirmed-claim-timeout, and until then the mark is the disruption
// under way that keeps the charge (budget.DisruptionUnderWay). A failure is
// logged: the charge then lasts until the node shows its deletion or the
// unconfirmed-claim timeout.
func MarkCharged(ctx context.Context, c client.Client, node *corev1.Node, now time.Time) {
	patch := client.MergeFrom(node.DeepCopy())
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation] = ngv1alpha1.FormatTime(now)
	if err := c.Patch(ctx, node, patch); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "Marking the NodeClaim deletion charged", "node", node.Name)
	}
}

// NodeClaimDeleting returns the budget status controller's
// DisruptionPending: a node whose NodeClaim's deletion was charged (the mark)
// is still on its way out while that NodeClaim is being deleted, however long
// Karpenter's finalizer takes (a backlog, a restart); its Node DELETE, which
// the budgets admit on this charge (Terminates), is yet to come. A NodeClaim
// that is gone, or not deleting (a later admission step refused its delete),
// leaves nothing on its way. reader reads NodeClaims fresh.
func NodeClaimDeleting(reader client.Reader) func(context.Context, *corev1.Node) (bool, error) {
	return func(ctx context.Context, node *corev1.Node) (bool, error) {
		if _, charged := node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation]; !charged {
			return false, nil
		}
		claim, err := OwningNodeClaim(ctx, reader, node)
		if err != nil {
			return false, err
		}
		return claim != nil && claim.DeletionTimestamp != nil, nil
	}
}
