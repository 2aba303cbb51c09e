package webhook

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Backfill adds the termination finalizer to managed nodes that lack it: nodes
// that existed before nodeguard was installed, or were created or updated while
// its webhook was unreachable.
type Backfill struct {
	Client   client.Client
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// SetupBackfill registers the backfill controller; it sees only managed nodes
// that lack the finalizer and are not being deleted.
func SetupBackfill(mgr ctrl.Manager, managed labels.Selector) error {
	b := &Backfill{Client: mgr.GetClient(), Managed: managed, Recorder: mgr.GetEventRecorder("nodeguard-backfill"), Clock: clock.RealClock{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("finalizer-backfill").
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(b.interesting))).
		Complete(b)
}

// interesting passes managed nodes that need the finalizer, and nodes that
// carry a finalizer-added-at mark to clean up.
func (b *Backfill) interesting(obj client.Object) bool {
	_, marked := obj.GetAnnotations()[ngv1alpha1.FinalizerAddedAtAnnotation]
	return marked || b.needsFinalizer(obj)
}

func (b *Backfill) needsFinalizer(obj client.Object) bool {
	return obj.GetDeletionTimestamp() == nil &&
		b.Managed.Matches(labels.Set(obj.GetLabels())) &&
		!slices.Contains(obj.GetFinalizers(), ngv1alpha1.TerminationFinalizer)
}

// Reconcile adds the finalizer, with the time it was added, by an
// optimistic-lock patch that touches no other finalizer; once that time is
// past the hold, it removes the mark again.
func (b *Backfill) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := b.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !b.needsFinalizer(&node) {
		return b.clearMark(ctx, &node)
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	markFinalizerAdded(&node, b.Clock.Now())
	if err := b.Client.Patch(ctx, &node, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("adding finalizer to node %s: %w", node.Name, err)
	}
	if b.Recorder != nil {
		b.Recorder.Eventf(&node, nil, corev1.EventTypeNormal, ReasonFinalizerAdded, "Backfill",
			"added the %s finalizer so that nodeguard drains the node before it goes", ngv1alpha1.TerminationFinalizer)
	}
	return reconcile.Result{RequeueAfter: finalizerAddedHold}, nil
}

// clearMark removes an expired finalizer-added-at mark, but not from a node
// being deleted: no admission reads it any more, the node goes with it, and
// each write of a node goes to every watcher of nodes.
func (b *Backfill) clearMark(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	value, marked := node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
	if !marked || node.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	// An unreadable mark is removed at once: admission treats it as fresh.
	now := b.Clock.Now()
	if addedAt, err := ngv1alpha1.ParseTime(value); err == nil && now.Before(addedAt.Add(finalizerAddedHold)) {
		return reconcile.Result{RequeueAfter: addedAt.Add(finalizerAddedHold).Sub(now)}, nil
	}
	patch := client.MergeFrom(node.DeepCopy())
	delete(node.Annotations, ngv1alpha1.FinalizerAddedAtAnnotation)
	if err := b.Client.Patch(ctx, node, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}
