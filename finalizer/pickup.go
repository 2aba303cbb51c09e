package finalizer

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// pickUp charges a drain that no eviction charged, of a node cordoned or
// whose DrainInProgress another writer set True: one that began while
// nodeguard's eviction webhook was not answering. A node that shows no drain
// yet is left to its first eviction.
func (r *Reconciler) pickUp(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if givenUpMarked(node) {
		return r.afterGiveUp(ctx, node)
	}
	if !ngv1alpha1.DrainShown(node) || ngv1alpha1.ChargedElsewhere(node) != "" {
		r.forget(ctx, node.UID)
		return reconcile.Result{}, nil
	}
	by, found, err := r.drainUnderWay(ctx, node)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case !found:
		// A drainer cordons, then evicts: look again for a while. Past
		// the window a node left cordoned costs no more reads.
		if seen := r.cordonSeenAt(node.UID, r.Clock.Now()); r.Clock.Since(seen) < pickUpWindow {
			return reconcile.Result{RequeueAfter: pickUpPoll}, nil
		}
		return reconcile.Result{}, nil
	}
	v, err := r.Outside.Rule.Decide(ctx, node, false)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !v.Allowed {
		if r.once(node.UID, "over-budget") {
			r.event(node, corev1.EventTypeWarning, ReasonDrainOverBudget,
				"a drain by %s found under way (begun while nodeguard was not answering evictions) exceeds the budget: %s; its further evictions are refused until there is room",
				by, v.Message)
		}
		return reconcile.Result{RequeueAfter: holdPoll}, nil
	}
	patch := client.MergeFrom(node.DeepCopy())
	ngv1alpha1.MarkDrainCharged(node, r.Clock.Now(), by, "")
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		if gerr := r.Outside.Rule.Claimer.GiveBack(ctx, v.Charged, node.Name); gerr != nil {
			err = fmt.Errorf("%w (and giving the charge back: %v)", err, gerr)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.event(node, corev1.EventTypeNormal, ReasonDrainFound, "a drain by %s found under way, %s", by, v.Message)
	return reconcile.Result{Requeue: true}, nil
}

// drainUnderWay looks for a drain of the node and names its drainer: a
// DrainInProgress condition nodeguard did not write
// (ngv1alpha1.DrainInProgressByOther: nodeguard writes its own only on nodes
// it terminates or has charged, and one it left behind is no drain), a
// maintenance Lease someone else holds, or a pod evicted through the
// Eviction API.
func (r *Reconciler) drainUnderWay(ctx context.Context, node *corev1.Node) (string, bool, error) {
	if ngv1alpha1.DrainInProgressByOther(node) {
		c := nodeCondition(node, corev1.NodeDrainInProgress)
		return fmt.Sprintf("the writer of its DrainInProgress condition (reason %s)", c.Reason), true, nil
	}
	var lease coordinationv1.Lease
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	if client.IgnoreNotFound(err) != nil {
		return "", false, fmt.Errorf("reading maintenance Lease of node %s: %w", node.Name, err)
	}
	if err == nil {
		if hold := budget.HeldByOther(&lease, r.Clock.Now()); hold != nil {
			return "the holder of its maintenance Lease, " + hold.Holder, true, nil
		}
	}
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return "", false, fmt.Errorf("listing pods of node %s: %w", node.Name, err)
	}
	for i := range pods.Items {
		if evictedByAPI(&pods.Items[i]) {
			return "an unknown drainer (pods evicted while nodeguard was not answering evictions)", true, nil
		}
	}
	return "", false, nil
}

// evictedByAPI reports a pod the Eviction API is deleting: its
// DisruptionTarget condition says so while it terminates.
func evictedByAPI(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "EvictionByEvictionAPI" {
			return true
		}
	}
	return false
}
