package karpenter

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

const (
	// ReasonDisruptionAbandoned (Node, Warning): nodeguard had denied the
	// node's NodeClaim delete for DeniedReleaseAfter while Karpenter kept it
	// tainted karpenter.sh/disrupted; nodeguard removed the taint.
	ReasonDisruptionAbandoned = "KarpenterDisruptionAbandoned"
	// actionRelease: removing a disrupted taint Karpenter left.
	actionRelease = "ReleaseKarpenterDisruption"
)

// DeniedReleaseAfter is how long after nodeguard first denied a node's
// NodeClaim DELETE it gives the node back to service. Karpenter retries a
// denied delete about every second while its command lives (up to its
// 10-minute command timeout), or not at all once the command's first
// candidate is gone; either way the node would sit tainted and cut, serving
// nothing, while its budget refuses it.
const DeniedReleaseAfter = 30 * time.Second

// Release gives back to service a node Karpenter tainted karpenter.sh/disrupted
// for a disruption whose NodeClaim delete nodeguard has denied for
// DeniedReleaseAfter. Karpenter v1.14.1's orchestration queue retries a
// command through its first candidate's NodeClaim: while that one is denied,
// it retries every delete of the command every second until the command
// times out (10 minutes at least), and only then un-taints the candidates;
// once that one is admitted and gone, it neither retries the other deletes
// nor un-taints their nodes until it restarts. Which candidate is first is
// Karpenter's choice, so both happen. Removing the taint restores the node's
// load-balancer traffic (the taint is a signal taint) and lets it take pods;
// a delete Karpenter retries later is admitted within the budget and drains
// the node as usual.
type Release struct {
	Client client.Client
	// Reader reads NodeClaims fresh from the API server.
	Reader   client.Reader
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// SetupRelease registers the controller; it sees only nodes with a denial
// mark.
func SetupRelease(mgr ctrl.Manager) error {
	r := &Release{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("nodeguard-karpenter"), Clock: clock.RealClock{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("karpenter-release").
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			_, marked := obj.GetAnnotations()[ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation]
			return marked
		}))).
		Complete(r)
}

// Reconcile waits until the first denial is DeniedReleaseAfter old, then
// removes the mark and, if the node still carries it, the taint. A node being
// deleted is left alone (it goes, mark and all); a node whose NodeClaim is
// being deleted (a retried delete was admitted, the Node DELETE is to come)
// and a node without the taint (Karpenter gave the command up itself,
// restarted, or never tainted it, as for an expired node) only lose the mark.
func (r *Release) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, marked := node.Annotations[ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation]; !marked || node.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	// An unreadable mark counts as old: removing the taint of a node Karpenter
	// still disrupts only delays it (Karpenter taints it again to drain it).
	if at, ok := ngv1alpha1.AnnotationTime(&node, ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation); ok {
		if wait := at.Add(DeniedReleaseAfter).Sub(r.Clock.Now()); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
	}
	claim, err := OwningNodeClaim(ctx, r.Reader, &node)
	if err != nil {
		return reconcile.Result{}, err
	}
	terminating := claim != nil && claim.DeletionTimestamp != nil
	tainted := Disrupted(&node) && !terminating
	by := node.Annotations[ngv1alpha1.NodeClaimDeleteDeniedByAnnotation]
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(node.Annotations, ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation)
	delete(node.Annotations, ngv1alpha1.NodeClaimDeleteDeniedByAnnotation)
	if tainted {
		node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.KarpenterDisruptedTaintKey })
	}
	if err := r.Client.Patch(ctx, &node, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if tainted {
		taintsRemoved.Inc()
		r.event(&node, by)
	}
	return reconcile.Result{}, nil
}

func (r *Release) event(node *corev1.Node, by string) {
	if r.Recorder == nil {
		return
	}
	claim := "its NodeClaim"
	if ref := OwnerNodeClaim(node); ref != nil {
		claim = "NodeClaim " + ref.Name
	}
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonDisruptionAbandoned, actionRelease,
		"%s denied deleting %s for %s while Karpenter kept the node tainted %s: removed the taint so that the node takes pods and traffic again (a delete Karpenter retries later is admitted within the budget)",
		by, claim, DeniedReleaseAfter, ngv1alpha1.KarpenterDisruptedTaintKey)
}

var taintsRemoved = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "nodeguard_karpenter_disrupted_taints_removed_total",
	Help: "karpenter.sh/disrupted taints nodeguard removed from nodes whose NodeClaim delete it had denied for 30 s.",
})

func init() { metrics.Registry.MustRegister(taintsRemoved) }
