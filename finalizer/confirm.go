package finalizer

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// An eviction review is a claim, not a fact: the webhook port is reachable from
// any pod wherever no NetworkPolicy engine runs, and a review posted there
// charges a cordoned node's budgets, marks it and cuts its traffic as a real
// drain's first eviction does. So a charge the eviction webhook made stands
// only once nodeguard sees the API server carry out an eviction from the node,
// or while the drainer keeps asking (its evictions wait behind a 429, and each
// renews ngv1alpha1.DrainAskedAtAnnotation). Neither within
// --unconfirmed-claim-timeout: the charge is withdrawn (marks removed,
// disruption given back, None restored), as the budget status controller gives
// back a forged DELETE review's claim.

// ReasonDrainWithdrawn (Node, Warning): a drain's charge was withdrawn because
// no eviction followed it.
const ReasonDrainWithdrawn = "DrainChargeWithdrawn"

// LifecycleReasonUnconfirmed: the drain's conditions end because its charge
// was withdrawn.
const LifecycleReasonUnconfirmed = "DrainUnconfirmed"

// confirmCharge settles a charged drain whose eviction review is not yet
// confirmed: it records the confirmation when the node shows an eviction
// carried out, withdraws the charge once its deadline has passed, and
// otherwise returns how long until that deadline (0: nothing to wait for).
func (r *Reconciler) confirmCharge(ctx context.Context, node *corev1.Node, by string) (wait time.Duration, withdrawn bool, err error) {
	timeout := r.Outside.UnconfirmedTimeout
	if timeout <= 0 || !ngv1alpha1.DrainUnconfirmed(node) {
		return 0, false, nil
	}
	if signalledByOther(node, by) {
		// The drainer's own DrainInProgress says the node drains: pickUp
		// charges such a node with no eviction at all, so its review
		// claims nothing more, and withdrawing it would only flap the
		// charge and the traffic cut.
		return 0, false, r.recordConfirmed(ctx, node)
	}
	chargedAt, _ := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainChargedAtAnnotation)
	carried, err := r.evictionCarriedOut(ctx, node, chargedAt)
	if err != nil || carried {
		if carried {
			err = r.recordConfirmed(ctx, node)
		}
		return 0, false, err
	}
	last := chargedAt
	if asked, ok := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainAskedAtAnnotation); ok && asked.After(last) {
		last = asked
	}
	if left := last.Add(timeout).Sub(r.Clock.Now()); left > 0 {
		return left, false, nil
	}
	message := fmt.Sprintf("no eviction from the node was carried out, or asked again, within %s of the charge by %s "+
		"(an eviction review the API server never sent, or a drainer that gave up)", timeout, by)
	if _, err := r.closeDrain(ctx, node, LifecycleReasonUnconfirmed, message, nil); err != nil {
		return 0, false, err
	}
	drainChargesWithdrawn.Inc()
	r.event(node, corev1.EventTypeWarning, ReasonDrainWithdrawn,
		"withdrew the drain's charge, its marks and its traffic cut: %s; a real drain is charged again at its next eviction", message)
	r.forget(ctx, node.UID)
	return 0, true, nil
}

// evictionCarriedOut reports whether the node shows an eviction the API
// server carried out since the charge: the pod of the first eviction gone or
// terminating, or any pod of the node being evicted through the Eviction API
// (its DisruptionTarget condition, which only the API server writes there).
// The pods are read fresh: a fast drain's pods are gone before a cache shows
// them terminating.
func (r *Reconciler) evictionCarriedOut(ctx context.Context, node *corev1.Node, since time.Time) (bool, error) {
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return false, fmt.Errorf("listing pods of node %s: %w", node.Name, err)
	}
	first := node.Annotations[ngv1alpha1.DrainFirstEvictionAnnotation]
	firstSeen := false
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Namespace+"/"+p.Name == first {
			firstSeen = true
			if p.DeletionTimestamp != nil {
				return true, nil
			}
		}
		if evictedByAPI(p) && !evictedBefore(p, since) {
			return true, nil
		}
	}
	return !firstSeen, nil
}

// evictedBefore reports a pod whose eviction began before t (kept to the
// second, as the charge's time is): it was under way before the drain was
// charged and says nothing of it.
func evictedBefore(pod *corev1.Pod, t time.Time) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			return c.LastTransitionTime.Add(time.Second).Before(t)
		}
	}
	return false
}

// recordConfirmed marks the drain's charge confirmed: it stands until the node
// comes back, and no review renews it any more.
func (r *Reconciler) recordConfirmed(ctx context.Context, node *corev1.Node) error {
	patch := client.MergeFrom(node.DeepCopy())
	node.Annotations[ngv1alpha1.DrainConfirmedAtAnnotation] = ngv1alpha1.FormatTime(r.Clock.Now())
	delete(node.Annotations, ngv1alpha1.DrainAskedAtAnnotation)
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("confirming the drain of node %s: %w", node.Name, err))
	}
	return nil
}
