package autoscaler

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/kube/requeue"
)

// Waiting intervals. Budget status changes and node changes trigger passes at
// once; these are backstops.
const (
	// deniedRetry re-tries a denied claim (cluster-autoscaler polls its
	// delay-deletion wait every 5 s).
	deniedRetry = 5 * time.Second
	// claimTimeout bounds one pass's budget claims.
	claimTimeout = 10 * time.Second
)

// TrafficCut is what the hold needs of the Azure admin-state manager.
type TrafficCut interface {
	Confirmation(ctx context.Context, uid types.UID, state azure.AdminState, wait time.Duration) (azure.Confirmation, error)
}

// HoldReconciler keeps nodeguard's delay-deletion annotation on managed
// nodes and lets a scale-down through one budget claim at a time.
type HoldReconciler struct {
	Client client.Client
	// Rule decides a scale-down: the deletion doors' rule (budget.Rules),
	// which reads maintenance Leases and lets a node whose instance is gone
	// go uncharged; its Claimer gives a cancelled scale-down's claim back.
	Rule     *budget.Rule
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// AdminState is nil when Azure is not configured: the hold then waits for
	// the budget claim only.
	AdminState TrafficCut
	// AdminStateTimeout bounds the wait for Azure to confirm Down, counted
	// from the claim; past it the hold is released with a Warning event.
	AdminStateTimeout time.Duration
	// Disabled (--cluster-autoscaler-scale-down-hold=false) only removes what
	// nodeguard put on nodes.
	Disabled bool
	// Signals are the configured signal taints and who acts on them: the
	// hold waits for the cut only when the scale-down taint is nodeguard's
	// to act on.
	Signals azure.Signals

	nodes *budget.NodeLister
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch,namespace=kube-node-maintenance
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager reconciles a node when its scale-down state changes, and
// the nodes waiting for a claim when a budget changes.
func (r *HoldReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.nodes = budget.NewNodeLister(mgr.GetCache())
	return ctrl.NewControllerManagedBy(mgr).
		Named("scale-down-hold").
		For(&corev1.Node{}, builder.WithPredicates(holdStateChanged())).
		Watches(&ngv1alpha1.NodeDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.waitingNodes)).
		Complete(r)
}

// holdStateChanged passes node updates that change what the hold does: the
// scale-down taint, nodeguard's annotations, labels (managed or not) and
// deletion; heartbeats are dropped.
func holdStateChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldNode, ok1 := e.ObjectOld.(*corev1.Node)
			newNode, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return true
			}
			return ngv1alpha1.ScaleDownTainted(oldNode) != ngv1alpha1.ScaleDownTainted(newNode) ||
				!labels.Equals(oldNode.Labels, newNode.Labels) ||
				(oldNode.DeletionTimestamp == nil) != (newNode.DeletionTimestamp == nil) ||
				oldNode.Annotations[ngv1alpha1.DelayDeletionAnnotation] != newNode.Annotations[ngv1alpha1.DelayDeletionAnnotation] ||
				oldNode.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation] != newNode.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
		},
	}
}

// waitingNodes maps a budget change to the nodes whose scale-down waits for a
// claim.
func (r *HoldReconciler) waitingNodes(ctx context.Context, _ client.Object) []reconcile.Request {
	// Read only, on every budget change: no copy of every cached node.
	nodes, err := r.nodes.List(ctx, nil)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing nodes for a NodeDisruptionBudget change")
		return nil
	}
	var reqs []reconcile.Request
	for _, n := range nodes {
		if _, claimed := n.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]; ngv1alpha1.ScaleDownTainted(n) && !claimed {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
		}
	}
	return reqs
}

// Reconcile puts the hold on, lets a claimed scale-down through, or gives
// back the claim of a cancelled one. A node patch that lost to another writer
// is no failure: the pass runs again on the node as it now is.
func (r *HoldReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := r.pass(ctx, req)
	if again, lost := requeue.OnConflict(err); lost {
		logf.FromContext(ctx).V(1).Info("Node changed by another writer during the pass; looking again", "error", err.Error())
		return again, nil
	}
	return res, err
}

func (r *HoldReconciler) pass(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	switch {
	case node.DeletionTimestamp != nil:
		return reconcile.Result{}, nil // the Node DELETE path owns it now
	case r.Disabled || !r.Managed.Matches(labels.Set(node.Labels)):
		return reconcile.Result{}, r.letGo(ctx, &node)
	case !ngv1alpha1.ScaleDownTainted(&node):
		return reconcile.Result{}, r.standBy(ctx, &node)
	}
	for _, phase := range []func(context.Context, *corev1.Node) (reconcile.Result, bool, error){r.claim, r.awaitTrafficCut, r.release} {
		res, done, err := phase(ctx, &node)
		if err != nil || !done {
			return res, err
		}
	}
	return reconcile.Result{}, nil
}

// standBy is the state of an untainted managed node: the hold on, no claim.
// A claim left from a cancelled scale-down is given back first.
func (r *HoldReconciler) standBy(ctx context.Context, node *corev1.Node) error {
	_, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
	if node.Annotations[ngv1alpha1.DelayDeletionAnnotation] == ngv1alpha1.DelayDeletionValue && !claimed {
		return nil
	}
	if claimed {
		if err := r.giveBack(ctx, node); err != nil {
			return err
		}
	}
	if err := r.patchAnnotations(ctx, node, func(a map[string]string) {
		a[ngv1alpha1.DelayDeletionAnnotation] = ngv1alpha1.DelayDeletionValue
		delete(a, ngv1alpha1.ScaleDownClaimedAnnotation)
	}); err != nil {
		return err
	}
	if claimed {
		r.event(node, corev1.EventTypeNormal, ReasonScaleDownCancelled,
			"cluster-autoscaler's %s taint is gone: gave back the scale-down's disruption claims and put the %s hold back",
			ngv1alpha1.ClusterAutoscalerTaintKey, ngv1alpha1.DelayDeletionAnnotation)
	}
	return nil
}

// letGo removes what nodeguard put on a node it no longer manages (or on
// every node, with the hold disabled).
func (r *HoldReconciler) letGo(ctx context.Context, node *corev1.Node) error {
	_, held := node.Annotations[ngv1alpha1.DelayDeletionAnnotation]
	_, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
	if !held && !claimed {
		return nil
	}
	if claimed {
		if err := r.giveBack(ctx, node); err != nil {
			return err
		}
	}
	return r.patchAnnotations(ctx, node, func(a map[string]string) {
		delete(a, ngv1alpha1.DelayDeletionAnnotation)
		delete(a, ngv1alpha1.ScaleDownClaimedAnnotation)
	})
}

// claim charges the scale-down to every budget selecting the node by the
// rule a Node DELETE is decided by, and marks the node claimed: from then on
// its scale-down taint counts it unavailable, and the budgets' status drops
// the charge.
func (r *HoldReconciler) claim(ctx context.Context, node *corev1.Node) (reconcile.Result, bool, error) {
	if _, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]; claimed {
		return reconcile.Result{}, true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	v, err := r.judge(ctx, node)
	if err != nil {
		return reconcile.Result{}, false, err
	}
	if !v.Allowed {
		scaleDownClaims.WithLabelValues(resultDenied).Inc()
		r.event(node, corev1.EventTypeWarning, ReasonScaleDownDenied,
			"cluster-autoscaler's scale-down is held (%s stays on the node, and evictions from it are refused): %s; a drain refused for cluster-autoscaler's --max-pod-eviction-time fails and the node stays, but an empty node's VM is deleted anyway once its --node-deletion-delay-timeout passes",
			ngv1alpha1.DelayDeletionAnnotation, v.Message)
		return reconcile.Result{RequeueAfter: deniedRetry}, false, nil
	}
	if err := r.patchAnnotations(ctx, node, func(a map[string]string) {
		a[ngv1alpha1.ScaleDownClaimedAnnotation] = ngv1alpha1.FormatTime(r.Clock.Now())
	}); err != nil {
		return reconcile.Result{}, false, err // the charge stays; the next pass finds it (claims are idempotent)
	}
	scaleDownClaims.WithLabelValues(resultGranted).Inc()
	r.event(node, corev1.EventTypeNormal, ReasonScaleDownClaimed, "cluster-autoscaler's scale-down is admitted: %s", v.Message)
	return reconcile.Result{}, true, nil
}

// judge applies the disruption rule to the scale-down, with an event on each
// budget it charged and on the one that refused.
func (r *HoldReconciler) judge(ctx context.Context, node *corev1.Node) (budget.Verdict, error) {
	v, err := r.Rule.Decide(ctx, node, false)
	if err != nil || r.Recorder == nil {
		return v, err
	}
	for _, c := range v.Charged {
		r.Recorder.Eventf(c.Budget, node, corev1.EventTypeNormal, budget.ReasonDisruptionClaimed, actionHold,
			"charged cluster-autoscaler's scale-down of node %s", node.Name)
	}
	if v.Denier != nil {
		r.Recorder.Eventf(v.Denier, node, corev1.EventTypeWarning, budget.ReasonDisruptionDenied, actionHold,
			"refused cluster-autoscaler's scale-down of node %s: %s", node.Name, v.Message)
	}
	return v, nil
}

// giveBack releases the node's charge from every budget selecting it.
func (r *HoldReconciler) giveBack(ctx context.Context, node *corev1.Node) error {
	budgets, err := budget.Matching(ctx, r.Client, node)
	if err != nil {
		return err
	}
	return r.Rule.Claimer.ReleaseAll(ctx, budgets, node.Name)
}

// awaitTrafficCut waits, for at most AdminStateTimeout from the claim, until
// Azure confirms the node's entries Down (the scale-down taint is a signal
// taint: the taint watcher asked for Down when it appeared).
func (r *HoldReconciler) awaitTrafficCut(ctx context.Context, node *corev1.Node) (reconcile.Result, bool, error) {
	if r.AdminState == nil || !r.cutsTraffic(node) {
		return reconcile.Result{}, true, nil
	}
	if _, held := node.Annotations[ngv1alpha1.DelayDeletionAnnotation]; !held {
		return reconcile.Result{}, true, nil // released already
	}
	switch state, err := r.AdminState.Confirmation(ctx, node.UID, azure.AdminStateDown, 200*time.Millisecond); {
	case state == azure.Confirmed:
		return reconcile.Result{}, true, nil
	case state == azure.ConfirmFailed:
		r.event(node, corev1.EventTypeWarning, ReasonScaleDownTrafficCutTimedOut,
			"setting the load-balancer AdminState Down failed (%v): letting cluster-autoscaler delete the VM anyway", err)
		return reconcile.Result{}, true, nil
	case ctx.Err() != nil:
		return reconcile.Result{}, false, ctx.Err()
	}
	// Not confirmed yet, or the taint watcher has not handed the node over yet.
	claimedAt, _ := ngv1alpha1.AnnotationTime(node, ngv1alpha1.ScaleDownClaimedAnnotation)
	if deadline := claimedAt.Add(r.AdminStateTimeout); r.Clock.Now().Before(deadline) {
		return reconcile.Result{RequeueAfter: azure.ConfirmationPoll}, false, nil
	}
	r.event(node, corev1.EventTypeWarning, ReasonScaleDownTrafficCutTimedOut,
		"Azure did not confirm AdminState Down within --admin-state-timeout (%s): letting cluster-autoscaler delete the VM anyway", r.AdminStateTimeout)
	return reconcile.Result{}, true, nil
}

// cutsTraffic reports whether the node's scale-down taint is a signal taint
// (--signal-taints) that nodeguard sets Down for (--signal-admin-state).
func (r *HoldReconciler) cutsTraffic(node *corev1.Node) bool {
	return r.Signals.ByNodeguard() && slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
		_, signal := r.Signals.Table.Of(t)
		return signal && t.Key == ngv1alpha1.ClusterAutoscalerTaintKey
	})
}

// release removes the hold: cluster-autoscaler's delay-deletion wait ends and
// it deletes the VM.
func (r *HoldReconciler) release(ctx context.Context, node *corev1.Node) (reconcile.Result, bool, error) {
	if _, held := node.Annotations[ngv1alpha1.DelayDeletionAnnotation]; !held {
		return reconcile.Result{}, true, nil
	}
	if err := r.patchAnnotations(ctx, node, func(a map[string]string) { delete(a, ngv1alpha1.DelayDeletionAnnotation) }); err != nil {
		return reconcile.Result{}, false, err
	}
	if tainted, ok := taintedAt(node); ok {
		scaleDownHeld.Observe(r.Clock.Since(tainted).Seconds())
	}
	r.event(node, corev1.EventTypeNormal, ReasonScaleDownReleased,
		"scale-down admitted and traffic cut: removed %s, cluster-autoscaler may delete the VM", ngv1alpha1.DelayDeletionAnnotation)
	return reconcile.Result{}, true, nil
}

// taintedAt is when cluster-autoscaler tainted the node: it writes the Unix
// time as the taint's value.
func taintedAt(node *corev1.Node) (time.Time, bool) {
	for _, t := range node.Spec.Taints {
		if t.Key != ngv1alpha1.ClusterAutoscalerTaintKey {
			continue
		}
		if t.TimeAdded != nil {
			return t.TimeAdded.Time, true
		}
		if sec, err := strconv.ParseInt(t.Value, 10, 64); err == nil {
			return time.Unix(sec, 0), true
		}
	}
	return time.Time{}, false
}

// patchAnnotations changes the node's annotations with an optimistic lock, so
// a pass acting on a stale node retries from a fresh one.
func (r *HoldReconciler) patchAnnotations(ctx context.Context, node *corev1.Node, change func(map[string]string)) error {
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	change(node.Annotations)
	if err := r.Client.Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("patching node %s: %w", node.Name, err)
	}
	return nil
}

func (r *HoldReconciler) event(node *corev1.Node, eventType, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(node, nil, eventType, reason, actionHold, format, args...)
	}
}
