package finalizer

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// A drainer may signal its drain by KEP-5683's DrainInProgress=True alone,
// with no cordon. Such a drain lasts as long as its writer's condition does:
// while another writer's DrainInProgress is True the node is not "schedulable
// again", and once that writer sets it False or removes it the drain ends as
// an uncordon ends a cordoned one. The conditions of such a drain are its
// writer's: KEP-5683 defines no shared ownership of a lifecycle condition (its
// writers coordinate outside the API), and Drained means the drainer's
// criteria are met, not nodeguard's plan; nodeguard writes neither, and says
// what it sees in its events. nodeguard knows its own DrainInProgress, which
// it writes on the cordoned drains it follows, from another writer's by
// ngv1alpha1.DrainConditionAnnotation, which only its ServiceAccount may
// write: a reason or a message would be anyone's who may update nodes/status.
//
// A drain that began while nodeguard was down (its eviction webhook fails
// open) is picked up on the node's next pass: a cordoned node with a
// DrainInProgress condition nodeguard did not write, a maintenance Lease held
// by someone else, or a pod evicted through the Eviction API is charged as its
// first eviction would have been (pickup.go).

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
	if _, charged := ngv1alpha1.DrainCharged(node); charged || givenUpMarked(node) {
		return true
	}
	return ngv1alpha1.DrainShown(node) && r.Outside.Managed.Matches(labels.Set(node.Labels))
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
	return by, !r.followsOutside() && charged && node.DeletionTimestamp == nil && drainOver(node, by)
}

// drainOver reports whether the charged node is back from its drain:
// schedulable, Ready, and with no DrainInProgress of another writer's still
// saying it drains.
func drainOver(node *corev1.Node, by string) bool {
	return !ngv1alpha1.Cordoned(node) && !signalledByOther(node, by) && ngv1alpha1.Ready(node)
}

// followedMessage begins the message of the DrainInProgress condition
// nodeguard writes on a drain it follows.
func followedMessage(by string) string {
	return "drained by " + by + "; nodeguard counts it against the node's budgets"
}

// signalledByOther reports whether the charged node's DrainInProgress is True
// and another writer's (ngv1alpha1.DrainInProgressByOther): its drain lasts
// while it is. A condition a nodeguard before DrainConditionAnnotation wrote
// on this drain (no mark at all, and its message) is nodeguard's own:
// taken for another writer's, it would keep the drain charged for good once
// the node comes back. Only nodeguard's own drain is ended early by such a
// look-alike message, never another node's.
func signalledByOther(node *corev1.Node, by string) bool {
	if !ngv1alpha1.DrainInProgressByOther(node) {
		return false
	}
	_, marked := node.Annotations[ngv1alpha1.DrainConditionAnnotation]
	return marked || !strings.HasPrefix(nodeCondition(node, corev1.NodeDrainInProgress).Message, followedMessage(by))
}

// wroteConditions reports whether nodeguard wrote the lifecycle conditions of
// the charged node's drain: it marked them (DrainConditionAnnotation), or an
// earlier version wrote its DrainInProgress (signalledByOther).
func wroteConditions(node *corev1.Node, by string) bool {
	if _, marked := node.Annotations[ngv1alpha1.DrainConditionAnnotation]; marked {
		return true
	}
	c := nodeCondition(node, corev1.NodeDrainInProgress)
	return c != nil && c.Status == corev1.ConditionTrue && !signalledByOther(node, by)
}

// follow runs one pass over a followed node.
func (r *Reconciler) follow(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	by, charged := ngv1alpha1.DrainCharged(node)
	if !charged {
		return r.pickUp(ctx, node)
	}
	if drainOver(node, by) {
		return r.endDrain(ctx, node, by)
	}
	if why, reason := drainerGaveUp(node); why != "" {
		return r.giveUp(ctx, node, by, why, reason)
	}
	if err := r.noteDrainCondition(ctx, node, by); err != nil {
		return reconcile.Result{}, err
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
	// The conditions of a drain another writer's DrainInProgress signals
	// are that writer's (see the top of this file).
	other := signalledByOther(node, by)
	if plan.Remaining() == 0 {
		if other {
			if r.once(node.UID, "outside-drained") {
				r.event(node, corev1.EventTypeNormal, ReasonOutsideDrained,
					"every evictable pod is gone (drain by %s; its DrainInProgress and Drained conditions are its own to write)", by)
			}
			return reconcile.Result{}, nil
		}
		if c := nodeCondition(node, corev1.NodeDrained); c == nil || c.Status != corev1.ConditionTrue {
			r.event(node, corev1.EventTypeNormal, ReasonOutsideDrained, "every evictable pod is gone (drain by %s)", by)
		}
		if _, marked := node.Annotations[ngv1alpha1.DrainConditionAnnotation]; !marked {
			if err := r.markConditionsOwn(ctx, node, r.Clock.Now()); err != nil {
				return reconcile.Result{}, err
			}
		}
		r.markDrained(node)
		return reconcile.Result{}, nil // its pods' and its own changes wake it
	}
	settling, err := r.replaceBlocked(ctx, node, plan, false)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !other {
		message := followedMessage(by)
		if notes := groupNotes(plan); notes != "" {
			message += "; " + notes
		}
		if err := r.stageFollowedInProgress(ctx, node, message); err != nil {
			return reconcile.Result{}, err
		}
	}
	next := r.podsGoneWait()
	if settling > 0 && settling < next {
		next = settling
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// stageFollowedInProgress stages nodeguard's DrainInProgress=True on a
// followed drain whose condition is not another writer's. Set True afresh, it
// is marked nodeguard's first (DrainConditionAnnotation, its transition time
// to the second): written the other way round, a failed mark would leave
// nodeguard's condition looking like another writer's, which keeps a drain
// charged for as long as it stands.
func (r *Reconciler) stageFollowedInProgress(ctx context.Context, node *corev1.Node, message string) error {
	c := nodeCondition(node, corev1.NodeDrainInProgress)
	if c != nil && c.Status == corev1.ConditionTrue {
		if c.Message != message { // nodeguard's own: its transition stays
			r.stageCondition(node, corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue,
				Reason: LifecycleReasonAdminRequested, Message: message})
		}
		return nil
	}
	at := metav1.NewTime(r.Clock.Now().UTC().Truncate(time.Second))
	if err := r.markConditionsOwn(ctx, node, at.Time); err != nil {
		return err
	}
	r.stageCondition(node, corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue,
		Reason: LifecycleReasonAdminRequested, Message: message})
	// The transition is the mark's time, not the clock's a moment later.
	nodeCondition(node, corev1.NodeDrainInProgress).LastTransitionTime = at
	r.stage(node.UID, func(s *stagedConditions) {
		for i := range s.set {
			if s.set[i].Type == corev1.NodeDrainInProgress {
				s.set[i].LastTransitionTime = at
			}
		}
	})
	return nil
}

// markConditionsOwn records on the node that nodeguard writes its drain's
// lifecycle conditions, and when it set DrainInProgress True
// (ngv1alpha1.DrainConditionAnnotation).
func (r *Reconciler) markConditionsOwn(ctx context.Context, node *corev1.Node, at time.Time) error {
	return r.annotate(ctx, node, ngv1alpha1.DrainConditionAnnotation, ngv1alpha1.FormatTime(at.UTC().Truncate(time.Second)))
}

// endDrain removes the marks (the taint watcher then restores None), gives
// the node's disruption back to its budgets and says the drain is over.
func (r *Reconciler) endDrain(ctx context.Context, node *corev1.Node, by string) (reconcile.Result, error) {
	names, err := r.closeDrain(ctx, node, LifecycleReasonUncordoned, "the node is schedulable and Ready again", nil)
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
	ngv1alpha1.DrainConditionAnnotation, ngv1alpha1.DrainConditionSeenAtAnnotation,
}

// closeDrain ends a charged drain: the conditions nodeguard wrote False (for
// reason; another writer's are left as they are), its TrafficCut condition
// and its marks removed (the mark of nodeguard's conditions after they are
// False) and the annotations of set written in the same patch, its
// disruption given back to the budgets it names.
func (r *Reconciler) closeDrain(ctx context.Context, node *corev1.Node, reason, message string, set map[string]string) ([]string, error) {
	budgets, err := budget.Matching(ctx, r.Client, node)
	if err != nil {
		return nil, err
	}
	if by, _ := ngv1alpha1.DrainCharged(node); wroteConditions(node, by) {
		other := signalledByOther(node, by)
		for _, typ := range []corev1.NodeConditionType{corev1.NodeDrainInProgress, corev1.NodeDrained} {
			if c := nodeCondition(node, typ); c != nil && c.Status == corev1.ConditionTrue && (typ != corev1.NodeDrainInProgress || !other) {
				r.stageCondition(node, corev1.NodeCondition{Type: typ, Status: corev1.ConditionFalse, Reason: reason, Message: message})
			}
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
	for key, value := range set {
		node.Annotations[key] = value
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
