package finalizer

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// Drains nodeguard did not start (kubectl drain, an AKS upgrade, a reboot
// daemon). The eviction webhook charges such a drain at its first eviction
// from the cordoned node and marks the node (ngv1alpha1.DrainCharged); from
// then on this controller follows the node as it follows its own drains, minus
// the evictions, which are the drainer's:
//   - the traffic cut (cutTraffic; the taint watcher asks for Down while the
//     mark stands): the webhook answers evictions "retry" until it is recorded;
//   - replacement first for pods under a PodDisruptionBudget blocked by design,
//     so that the drainer's next retry succeeds (replaceBlocked);
//   - KEP-5683's DrainInProgress and Drained conditions;
//   - the end: once the node is schedulable and Ready again (kubectl uncordon,
//     an upgrade's reimage and uncordon), the disruption is given back to the budgets and
//     the marks removed, which restores None on its load-balancer entries.
//
// A drain that began while nodeguard was down (its eviction webhook fails
// open) is picked up on the node's next pass: a cordoned node with a
// DrainInProgress condition nodeguard did not write, a maintenance Lease held
// by someone else, or a pod evicted through the Eviction API is charged as its
// first eviction would have been.

// phaseFollow names the phase of a followed drain (r.phases): PDB changes wake
// the node like a drain of nodeguard's own.
const phaseFollow = "follow"

// OutsideDrains configures the following of drains nodeguard did not start.
type OutsideDrains struct {
	// Rule charges a drain found under way (the eviction webhook's rule).
	Rule *budget.Rule
	// Managed selects the nodes nodeguard manages.
	Managed labels.Selector
	// Off (--outside-drains=false) follows no drain: only the drains charged
	// before end, with their charges given back through Rule.
	Off bool
	// UnconfirmedTimeout (--unconfirmed-claim-timeout) withdraws the charge
	// of an eviction review that no eviction followed (confirm.go); 0 never
	// does.
	UnconfirmedTimeout time.Duration
}

// followsOutside reports whether the controller follows outside drains.
func (r *Reconciler) followsOutside() bool { return r.Outside != nil && !r.Outside.Off }

// Event reasons of followed drains.
const (
	// ReasonDrainFound (Node): a drain that began while nodeguard was not
	// answering evictions was charged to the node's budgets.
	ReasonDrainFound = "DrainFoundUnderWay"
	// ReasonDrainOverBudget (Node, Warning): such a drain exceeds a budget;
	// its further evictions are refused until there is room.
	ReasonDrainOverBudget = "DrainOverBudget"
	// ReasonDrainEnded (Node): the node is schedulable and Ready again; its
	// disruption was given back and its traffic restored.
	ReasonDrainEnded = "DrainEnded"
	// ReasonOutsideDrained (Node): every evictable pod of a followed drain is gone.
	ReasonOutsideDrained = "DrainCompleted"
)

// LifecycleReasonUncordoned: the node is schedulable again (a followed
// drain's end).
const LifecycleReasonUncordoned = "Uncordoned"

// followed reports whether the controller follows the node: its drain was
// charged, or it is cordoned and may show one.
func (r *Reconciler) followed(node *corev1.Node) bool {
	if !r.followsOutside() || node.DeletionTimestamp != nil {
		return false
	}
	if _, charged := ngv1alpha1.DrainCharged(node); charged {
		return true
	}
	return drainShown(node) && r.Outside.Managed.Matches(labels.Set(node.Labels))
}

// watchedOutside reports the nodes the controller watches beside those it
// terminates: the ones it follows, and, while it follows none, those still
// marked by a drain it charged before (unfollowedDrainEnded).
func (r *Reconciler) watchedOutside(node *corev1.Node) bool {
	if !r.followsOutside() {
		_, charged := ngv1alpha1.DrainCharged(node)
		return charged
	}
	return r.followed(node)
}

// unfollowedDrainEnded reports a node whose drain was charged while outside
// drains were followed, that is schedulable and Ready again now that they are
// not (--outside-drains=false, set mid-drain to let an upgrade through): its
// marks would otherwise keep it unavailable to its budgets, and its traffic
// cut, for good.
func (r *Reconciler) unfollowedDrainEnded(node *corev1.Node) (by string, ended bool) {
	by, charged := ngv1alpha1.DrainCharged(node)
	return by, !r.followsOutside() && charged && node.DeletionTimestamp == nil && !node.Spec.Unschedulable && nodeReady(node)
}

// drainShown reports whether the node is cordoned or says it drains.
func drainShown(node *corev1.Node) bool {
	c := nodeCondition(node, corev1.NodeDrainInProgress)
	return node.Spec.Unschedulable || (c != nil && c.Status == corev1.ConditionTrue)
}

// follow runs one pass over a followed node.
func (r *Reconciler) follow(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	by, charged := ngv1alpha1.DrainCharged(node)
	if !charged {
		return r.pickUp(ctx, node)
	}
	if !node.Spec.Unschedulable && nodeReady(node) {
		return r.endDrain(ctx, node, by)
	}
	confirmWait, withdrawn, err := r.confirmCharge(ctx, node, by)
	if err != nil || withdrawn {
		return reconcile.Result{}, err
	}
	r.phases.set(node.UID, node.Name, phaseFollow)
	result, err := r.cutTraffic(ctx, node)
	if err == nil && result.IsZero() {
		result, err = r.followDrain(ctx, node, by)
	}
	if confirmWait > 0 && (result.RequeueAfter == 0 || confirmWait < result.RequeueAfter) {
		result.RequeueAfter = confirmWait // the charge's deadline
	}
	// Written at once: the eviction webhook reads the drain's TrafficCut.
	if ferr := r.flushConditionsNow(ctx, node); ferr != nil && err == nil {
		err = ferr
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("following the drain of node %s: %w", node.Name, err)
	}
	return result, nil
}

// followDrain writes the drain's conditions and runs replacement first for its
// pods; the node's pod watch wakes it as they go.
func (r *Reconciler) followDrain(ctx context.Context, node *corev1.Node, by string) (reconcile.Result, error) {
	r.pods.watch(node.Name)
	// DaemonSet pods stay: drainers leave them (kubectl drain --ignore-daemonsets).
	plan, fromWatch, err := r.planWith(ctx, node, false, false, drain.DaemonSetsSkip)
	if err == nil && fromWatch && plan.Remaining() == 0 {
		plan, _, err = r.planWith(ctx, node, false, true, drain.DaemonSetsSkip) // the watch may lag
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	r.rememberQueues(node.UID, plan.Groups)
	if plan.Remaining() == 0 {
		if c := nodeCondition(node, corev1.NodeDrained); c == nil || c.Status != corev1.ConditionTrue {
			r.event(node, corev1.EventTypeNormal, ReasonOutsideDrained, "every evictable pod is gone (drain by %s)", by)
		}
		r.markDrained(node)
		return reconcile.Result{}, nil // its pods' and its own changes wake it
	}
	settling, err := r.replaceBlocked(ctx, node, plan, false)
	if err != nil {
		return reconcile.Result{}, err
	}
	message := "drained by " + by + "; nodeguard counts it against the node's budgets"
	if notes := groupNotes(plan); notes != "" {
		message += "; " + notes
	}
	if c := nodeCondition(node, corev1.NodeDrainInProgress); c == nil || c.Status != corev1.ConditionTrue || c.Message != message {
		r.stageCondition(node, corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue,
			Reason: LifecycleReasonAdminRequested, Message: message})
	}
	next := r.podsGoneWait()
	if settling > 0 && settling < next {
		next = settling
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// endDrain removes the marks (the taint watcher then restores None), gives
// the node's disruption back to its budgets and says the drain is over.
func (r *Reconciler) endDrain(ctx context.Context, node *corev1.Node, by string) (reconcile.Result, error) {
	names, err := r.closeDrain(ctx, node, LifecycleReasonUncordoned, "the node is schedulable and Ready again")
	if err != nil {
		return reconcile.Result{}, err
	}
	off := ""
	if !r.followsOutside() {
		off = " (outside drains are no longer followed: --outside-drains=false)"
	}
	r.event(node, corev1.EventTypeNormal, ReasonDrainEnded,
		"schedulable and Ready again after the drain by %s: gave the disruption back to NodeDisruptionBudget(s) [%s] and restoring load-balancer traffic%s",
		by, strings.Join(names, ", "), off)
	r.forget(ctx, node.UID)
	return reconcile.Result{}, nil
}

// drainMarks are the annotations of a charged drain (ngv1alpha1.DrainCharged).
var drainMarks = []string{
	ngv1alpha1.DrainChargedAtAnnotation, ngv1alpha1.DrainedByAnnotation, ngv1alpha1.TrafficCutAtAnnotation,
	ngv1alpha1.DrainFirstEvictionAnnotation, ngv1alpha1.DrainAskedAtAnnotation, ngv1alpha1.DrainConfirmedAtAnnotation,
}

// closeDrain ends a charged drain: its conditions False (for reason), its
// TrafficCut condition and its marks removed, its disruption given back to
// the budgets it names.
func (r *Reconciler) closeDrain(ctx context.Context, node *corev1.Node, reason, message string) ([]string, error) {
	budgets, err := budget.Matching(ctx, r.Client, node)
	if err != nil {
		return nil, err
	}
	for _, typ := range []corev1.NodeConditionType{corev1.NodeDrainInProgress, corev1.NodeDrained} {
		if c := nodeCondition(node, typ); c != nil && c.Status == corev1.ConditionTrue {
			r.stageCondition(node, corev1.NodeCondition{Type: typ, Status: corev1.ConditionFalse, Reason: reason, Message: message})
		}
	}
	if nodeCondition(node, ngv1alpha1.TrafficCutCondition) != nil {
		r.stageRemoval(node, ngv1alpha1.TrafficCutCondition)
	}
	if err := r.flushConditionsNow(ctx, node); err != nil {
		return nil, err
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	for _, key := range drainMarks {
		delete(node.Annotations, key)
	}
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		// A conflict: the next pass decides again.
		return nil, client.IgnoreNotFound(fmt.Errorf("removing the drain marks of node %s: %w", node.Name, err))
	}
	// The claims go after the marks: a budget never counts the node out by
	// its mark after giving its disruption to the next node. A failed
	// give-back, or none (no rule to give it back with), is the budget
	// status controller's to prune (the node shows no disruption under way
	// any more).
	if r.Outside != nil {
		if err := r.Outside.Rule.Claimer.ReleaseAll(ctx, budgets, node.Name); err != nil {
			return nil, fmt.Errorf("giving back the drain of node %s: %w", node.Name, err)
		}
	}
	names := make([]string, 0, len(budgets))
	for _, b := range budgets {
		names = append(names, b.Name)
	}
	return names, nil
}

// pickUp charges a drain of a cordoned node that no eviction charged: one that
// began while nodeguard's eviction webhook was not answering. A node that shows
// no drain yet is left to its first eviction.
func (r *Reconciler) pickUp(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if !drainShown(node) || disruptedElsewhere(node) {
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
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.DrainChargedAtAnnotation] = ngv1alpha1.FormatTime(r.Clock.Now())
	node.Annotations[ngv1alpha1.DrainedByAnnotation] = by
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		if gerr := r.Outside.Rule.Claimer.GiveBack(ctx, v.Charged, node.Name); gerr != nil {
			err = fmt.Errorf("%w (and giving the charge back: %v)", err, gerr)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.event(node, corev1.EventTypeNormal, ReasonDrainFound, "a drain by %s found under way, %s", by, v.Message)
	return reconcile.Result{Requeue: true}, nil
}

// disruptedElsewhere reports a node whose disruption another door charged or
// that nodeguard terminates.
func disruptedElsewhere(node *corev1.Node) bool {
	if node.DeletionTimestamp != nil || ngv1alpha1.ScaleDownClaimed(node) || drainingTaint(node) != nil {
		return true
	}
	_, charged := node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation]
	return charged
}

// drainUnderWay looks for a drain of the cordoned node and names its drainer:
// a DrainInProgress condition nodeguard did not write (nodeguard writes its
// own only on nodes it terminates or has charged), a maintenance Lease
// someone else holds, or a pod evicted through the Eviction API.
func (r *Reconciler) drainUnderWay(ctx context.Context, node *corev1.Node) (string, bool, error) {
	if c := nodeCondition(node, corev1.NodeDrainInProgress); c != nil && c.Status == corev1.ConditionTrue {
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
