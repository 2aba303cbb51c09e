package webhook

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// nodeClaimGVK is Karpenter's NodeClaim, read (metadata only) to tell whether
// Karpenter already terminates a node.
var nodeClaimGVK = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaim"}

// +kubebuilder:rbac:groups=karpenter.sh,resources=nodeclaims,verbs=get

// ownerNodeClaim returns the reference to the NodeClaim that Karpenter puts
// on every node it registers (nil for other nodes).
func ownerNodeClaim(node *corev1.Node) *metav1.OwnerReference {
	for i, ref := range node.OwnerReferences {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && gv.Group == nodeClaimGVK.Group && ref.Kind == nodeClaimGVK.Kind {
			return &node.OwnerReferences[i]
		}
	}
	return nil
}

// karpenterTerminates says how Karpenter is already terminating the node, ""
// when it is not. Karpenter puts its termination finalizer on every node it
// registers, so the finalizer alone says nothing; Karpenter terminates a node
// by deleting its NodeClaim, and that DELETE is where the node's budgets
// applied (the NodeClaim webhook). A NodeClaim outside the webhook's
// objectSelector (the managed selector) charged nothing, and a NodeClaim that
// is gone while its node is not deleting was removed by force: both leave the
// Node DELETE to the budgets.
func karpenterTerminates(ctx context.Context, reader client.Reader, managed labels.Selector, node *corev1.Node) (string, error) {
	if !slices.Contains(node.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer) {
		return "", nil
	}
	claim, err := owningNodeClaim(ctx, reader, node)
	if err != nil || claim == nil || claim.DeletionTimestamp == nil || !managed.Matches(labels.Set(claim.Labels)) {
		return "", err
	}
	return fmt.Sprintf("its NodeClaim %s is being deleted, and that delete was charged to the node's budgets", claim.Name), nil
}

// owningNodeClaim reads the metadata of the NodeClaim that owns the node, nil
// when none does (no owner reference, no NodeClaim of that UID, or no
// NodeClaim API).
func owningNodeClaim(ctx context.Context, reader client.Reader, node *corev1.Node) (*metav1.PartialObjectMetadata, error) {
	ref := ownerNodeClaim(node)
	if ref == nil {
		return nil, nil
	}
	claim := &metav1.PartialObjectMetadata{}
	claim.SetGroupVersionKind(nodeClaimGVK)
	err := reader.Get(ctx, client.ObjectKey{Name: ref.Name}, claim)
	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading NodeClaim %s of node %s: %w", ref.Name, node.Name, err)
	case claim.UID != ref.UID:
		return nil, nil
	}
	return claim, nil
}

// karpenterDisrupted reports whether the node carries Karpenter's disrupted
// taint.
func karpenterDisrupted(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.KarpenterDisruptedTaintKey })
}

// deniedReleaseAfter is how long after nodeguard first denied a node's
// NodeClaim DELETE it gives the node back to service. Karpenter retries a
// denied delete about every second while its command lives (up to its
// 10-minute command timeout), or not at all once the command's first
// candidate is gone; either way the node would sit tainted and cut, serving
// nothing, while its budget refuses it.
const deniedReleaseAfter = 30 * time.Second

// markDenied records on the node when nodeguard first denied its NodeClaim's
// delete (kept while the denials go on), and what denied it last. It does not
// wait for the node to show
// Karpenter's disrupted taint: Karpenter taints a candidate a moment before
// it deletes the NodeClaim, and the node read from the cache may not show the
// taint yet. A failure is logged: the next retry's denial writes the mark
// again.
func (h *NodeClaimDeleteHandler) markDenied(ctx context.Context, node *corev1.Node, by string) {
	if h.Client == nil {
		return
	}
	now := h.Clock.Now()
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
	if err := h.Client.Patch(ctx, node, patch); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "Marking the NodeClaim delete denied", "node", node.Name)
	}
}

// markCharged records on the node that its NodeClaim's deletion was charged
// to its budgets: Karpenter deletes the Node only after the NodeClaim's
// finalizer ran, which a backlog or a leader change can delay past
// --unconfirmed-claim-timeout, and until then the mark is the disruption
// under way that keeps the charge (budget.DisruptionUnderWay). A failure is
// logged: the charge then lasts until the node shows its deletion or the
// unconfirmed-claim timeout.
func (h *NodeClaimDeleteHandler) markCharged(ctx context.Context, node *corev1.Node) {
	if h.Client == nil {
		return
	}
	patch := client.MergeFrom(node.DeepCopy())
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation] = ngv1alpha1.FormatTime(h.Clock.Now())
	if err := h.Client.Patch(ctx, node, patch); client.IgnoreNotFound(err) != nil {
		logf.FromContext(ctx).Error(err, "Marking the NodeClaim deletion charged", "node", node.Name)
	}
}

// deniedBy names what denied a NodeClaim DELETE, for the denial mark.
func (d decision) deniedBy(node *corev1.Node) string {
	switch {
	case d.denier != nil:
		return fmt.Sprintf("NodeDisruptionBudget %q", d.denier.Name)
	case d.reason == reasonMaintenanceHold:
		return fmt.Sprintf("maintenance Lease %s/%s", ngv1alpha1.MaintenanceLeaseNamespace, node.Name)
	}
	return "nodeguard"
}

// KarpenterRelease gives back to service a node Karpenter tainted
// karpenter.sh/disrupted for a disruption whose NodeClaim delete nodeguard
// has denied for deniedReleaseAfter. Karpenter v1.14.1's orchestration queue
// retries a command through its first candidate's NodeClaim: while that one
// is denied, it retries every delete of the command every second until the
// command times out (10 minutes at least), and only then un-taints the
// candidates; once that one is admitted and gone, it neither retries the
// other deletes nor un-taints their nodes until it restarts. Which candidate
// is first is Karpenter's choice, so both happen. Removing the taint restores
// the node's load-balancer traffic (the taint is a signal taint) and lets it
// take pods; a delete Karpenter retries later is admitted within the budget
// and drains the node as usual.
type KarpenterRelease struct {
	Client client.Client
	// Reader reads NodeClaims fresh from the API server.
	Reader   client.Reader
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// SetupKarpenterRelease registers the controller; it sees only nodes with a
// denial mark.
func SetupKarpenterRelease(mgr ctrl.Manager) error {
	r := &KarpenterRelease{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("nodeguard-karpenter"), Clock: clock.RealClock{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("karpenter-release").
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			_, marked := obj.GetAnnotations()[ngv1alpha1.NodeClaimDeleteDeniedAtAnnotation]
			return marked
		}))).
		Complete(r)
}

// Reconcile waits until the first denial is deniedReleaseAfter old, then
// removes the mark and, if the node still carries it, the taint. A node being
// deleted is left alone (it goes, mark and all); a node whose NodeClaim is
// being deleted (a retried delete was admitted, the Node DELETE is to come)
// and a node without the taint (Karpenter gave the command up itself,
// restarted, or never tainted it, as for an expired node) only lose the mark.
func (r *KarpenterRelease) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
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
		if wait := at.Add(deniedReleaseAfter).Sub(r.Clock.Now()); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
	}
	claim, err := owningNodeClaim(ctx, r.Reader, &node)
	if err != nil {
		return reconcile.Result{}, err
	}
	terminating := claim != nil && claim.DeletionTimestamp != nil
	tainted := karpenterDisrupted(&node) && !terminating
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
		karpenterTaintsRemoved.Inc()
		r.event(&node, by)
	}
	return reconcile.Result{}, nil
}

func (r *KarpenterRelease) event(node *corev1.Node, by string) {
	if r.Recorder == nil {
		return
	}
	claim := "its NodeClaim"
	if ref := ownerNodeClaim(node); ref != nil {
		claim = "NodeClaim " + ref.Name
	}
	r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonKarpenterDisruptionAbandoned, actionReleaseKarpenter,
		"%s denied deleting %s for %s while Karpenter kept the node tainted %s: removed the taint so that the node takes pods and traffic again (a delete Karpenter retries later is admitted within the budget)",
		by, claim, deniedReleaseAfter, ngv1alpha1.KarpenterDisruptedTaintKey)
}

var karpenterTaintsRemoved = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "nodeguard_karpenter_disrupted_taints_removed_total",
	Help: "karpenter.sh/disrupted taints nodeguard removed from nodes whose NodeClaim delete it had denied for 30 s.",
})

func init() { metrics.Registry.MustRegister(karpenterTaintsRemoved) }
