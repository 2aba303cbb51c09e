package autoscaler

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/kube/nodepatch"
	"github.com/nodeguard/nodeguard/kube/requeue"
)

// ScaleDownReconciler keeps cluster-autoscaler from picking a node that a
// budget could not let go: while any NodeDisruptionBudget selecting a managed
// node allows no disruption now, the node carries
// cluster-autoscaler.kubernetes.io/scale-down-disabled=true; when every one
// allows again, nodeguard removes it. It only ever removes the value it set
// (marked by nodeguard.io/scale-down-disabled): a user's annotation, whatever
// its value, is left alone.
//
// A budget marks its nodes only once it has allowed no disruption for
// MarkDelay: one that runs out for a moment, while the nodes it just admitted
// are released, would otherwise write every node it selects twice.
type ScaleDownReconciler struct {
	Client   client.Client
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// MarkDelay is how long a budget must have allowed no disruption before
	// its nodes are marked (0: DefaultMarkDelay).
	MarkDelay time.Duration

	nodes *budget.NodeLister
}

// DefaultMarkDelay is ScaleDownReconciler's MarkDelay: cluster-autoscaler
// looks every 10 s and picks a node only after it has been unneeded for
// minutes, so a shorter run-out would not have reached it anyway.
const DefaultMarkDelay = 10 * time.Second

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets,verbs=get;list;watch

// SetupWithManager reconciles a node when its labels or annotations change,
// and every node a budget selects when the budget changes.
func (r *ScaleDownReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.nodes = budget.NewNodeLister(mgr.GetCache())
	return ctrl.NewControllerManagedBy(mgr).
		Named("ndb-scale-down").
		For(&corev1.Node{}, builder.WithPredicates(labelsOrAnnotationsChanged())).
		Watches(&ngv1alpha1.NodeDisruptionBudget{}, handler.EnqueueRequestsFromMapFunc(r.selectedNodes),
			builder.WithPredicates(blockingChanged())).
		Complete(r)
}

// blockingChanged passes the budget changes that can set or clear the
// annotation: whether it allows a disruption, its selector, its evaluation.
// Its status changes with every claim; fanning each out to every node it
// selects would cost a reconcile per node per delete.
func blockingChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*ngv1alpha1.NodeDisruptionBudget)
			cur, ok2 := e.ObjectNew.(*ngv1alpha1.NodeDisruptionBudget)
			if !ok1 || !ok2 {
				return true
			}
			return (old.Status.DisruptionsAllowed > 0) != (cur.Status.DisruptionsAllowed > 0) ||
				old.Generation != cur.Generation || old.Status.ObservedGeneration != cur.Status.ObservedGeneration
		},
	}
}

func labelsOrAnnotationsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !labels.Equals(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
				e.ObjectOld.GetAnnotations()[ngv1alpha1.ScaleDownDisabledAnnotation] != e.ObjectNew.GetAnnotations()[ngv1alpha1.ScaleDownDisabledAnnotation] ||
				e.ObjectOld.GetAnnotations()[ngv1alpha1.ScaleDownDisabledByAnnotation] != e.ObjectNew.GetAnnotations()[ngv1alpha1.ScaleDownDisabledByAnnotation]
		},
	}
}

// selectedNodes maps a budget to the nodes it selects. A node a budget no
// longer selects (its selector changed) is reconciled at the next resync.
func (r *ScaleDownReconciler) selectedNodes(ctx context.Context, obj client.Object) []reconcile.Request {
	ndb, ok := obj.(*ngv1alpha1.NodeDisruptionBudget)
	if !ok {
		return nil
	}
	sel, err := budget.Selector(ndb)
	if err != nil {
		return nil
	}
	nodes, err := r.nodes.List(ctx, sel)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing the nodes of a NodeDisruptionBudget")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(nodes))
	for _, n := range nodes {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
	}
	return reqs
}

// Reconcile sets or removes nodeguard's scale-down-disabled annotation.
func (r *ScaleDownReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if node.DeletionTimestamp != nil {
		return reconcile.Result{}, nil // leaving anyway
	}
	blocking, wait, err := r.blockingBudget(ctx, &node)
	if err != nil {
		return reconcile.Result{}, err
	}
	_, ours := node.Annotations[ngv1alpha1.ScaleDownDisabledByAnnotation]
	_, anyValue := node.Annotations[ngv1alpha1.ScaleDownDisabledAnnotation]
	var patchErr error
	switch {
	case blocking != "" && !anyValue && wait > 0:
		return reconcile.Result{RequeueAfter: wait}, nil // not for long yet
	case blocking != "" && !anyValue:
		patchErr = r.patch(ctx, &node, true, blocking)
	case blocking == "" && ours:
		patchErr = r.patch(ctx, &node, false, "")
	}
	if apierrors.IsConflict(patchErr) {
		// Changed meanwhile (a deletion, a user's annotation): look again.
		return reconcile.Result{RequeueAfter: requeue.AfterConflict}, nil
	}
	return reconcile.Result{}, patchErr
}

// blockingBudget names a budget that selects the managed node and allows no
// disruption now ("" when none), the one that has for longest, and how long
// until it has for MarkDelay (0: it has). A budget not yet evaluated since
// its last change blocks nothing yet.
func (r *ScaleDownReconciler) blockingBudget(ctx context.Context, node *corev1.Node) (name string, wait time.Duration, err error) {
	if !r.Managed.Matches(labels.Set(node.Labels)) {
		return "", 0, nil
	}
	var list ngv1alpha1.NodeDisruptionBudgetList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil { // read only
		return "", 0, fmt.Errorf("listing NodeDisruptionBudgets: %w", err)
	}
	for i := range list.Items {
		b := &list.Items[i]
		if b.Status.ObservedGeneration < b.Generation || b.Status.DisruptionsAllowed > 0 {
			continue
		}
		if selects, err := budget.Selects(b, node); err != nil || !selects {
			continue
		}
		left := r.markDelay() - r.Clock.Since(blockedSince(b, r.Clock.Now()))
		if name == "" || left < wait {
			name, wait = b.Name, max(left, 0)
		}
	}
	return name, wait, nil
}

// blockedSince is when the budget last stopped allowing disruptions: its
// DisruptionAllowed condition's transition, or now when it has none.
func blockedSince(b *ngv1alpha1.NodeDisruptionBudget, now time.Time) time.Time {
	if c := meta.FindStatusCondition(b.Status.Conditions, ngv1alpha1.ConditionDisruptionAllowed); c != nil && c.Status == metav1.ConditionFalse {
		return c.LastTransitionTime.Time
	}
	return now
}

func (r *ScaleDownReconciler) markDelay() time.Duration {
	if r.MarkDelay > 0 {
		return r.MarkDelay
	}
	return DefaultMarkDelay
}

// patch sets or removes the annotation and nodeguard's mark. Its tests
// guard what it relies on (nodepatch): a node whose deletion began meanwhile
// is never written (it leaves anyway), and a user's annotation set meanwhile
// is never overwritten; other changes of the node never make it fail.
func (r *ScaleDownReconciler) patch(ctx context.Context, node *corev1.Node, disable bool, budget string) error {
	disabled, by := nodepatch.AnnotationPath(ngv1alpha1.ScaleDownDisabledAnnotation), nodepatch.AnnotationPath(ngv1alpha1.ScaleDownDisabledByAnnotation)
	ops := []nodepatch.Op{nodepatch.Test("/metadata/deletionTimestamp", nil)}
	switch {
	case disable && len(node.Annotations) == 0:
		ops = append(ops, nodepatch.Test("/metadata/annotations", nil), nodepatch.Add("/metadata/annotations", map[string]string{
			ngv1alpha1.ScaleDownDisabledAnnotation: "true", ngv1alpha1.ScaleDownDisabledByAnnotation: budget}))
	case disable:
		ops = append(ops, nodepatch.Test(disabled, nil), nodepatch.Add(disabled, "true"), nodepatch.Add(by, budget))
	default:
		ops = append(ops, nodepatch.Test(by, node.Annotations[ngv1alpha1.ScaleDownDisabledByAnnotation]), nodepatch.Remove(by))
		if value, ok := node.Annotations[ngv1alpha1.ScaleDownDisabledAnnotation]; ok {
			ops = append(ops, nodepatch.Test(disabled, value), nodepatch.Remove(disabled))
		}
	}
	if err := nodepatch.Apply(ctx, r.Client, node, ops...); err != nil {
		return fmt.Errorf("patching node %s: %w", node.Name, err)
	}
	if r.Recorder != nil {
		if disable {
			r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonScaleDownDisabled, actionScaleDown,
				"NodeDisruptionBudget %s allows no disruption now: set %s=true so that cluster-autoscaler does not pick the node", budget, ngv1alpha1.ScaleDownDisabledAnnotation)
		} else {
			r.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonScaleDownEnabled, actionScaleDown,
				"every NodeDisruptionBudget of the node allows a disruption again: removed the %s nodeguard set", ngv1alpha1.ScaleDownDisabledAnnotation)
		}
	}
	return nil
}
