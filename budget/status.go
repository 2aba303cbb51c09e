package budget

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/upgrade"
)

// DefaultClaimTimeout is how long a disruption claim may wait for its node to
// start deleting before it is given back (the PodDisruptionBudget one is 2 min).
// It covers deletes admitted by nodeguard but denied by a later admission step.
const DefaultClaimTimeout = 2 * time.Minute

// StatusReconciler keeps every NodeDisruptionBudget's status true to the nodes:
// counts, the DisruptionAllowed condition, and disruptedNodes pruned of nodes
// that are gone, of claims that expired, and of claims whose node showed no
// disruption within UnconfirmedTimeout (prune.go).
type StatusReconciler struct {
	Client client.Client
	// Reader reads claimed nodes fresh from the API server before a claim is
	// dropped on the cache's word (default: the manager's API reader).
	Reader       client.Reader
	Clock        clock.PassiveClock
	ClaimTimeout time.Duration
	// UnconfirmedTimeout, if positive, gives back a claim whose node shows no
	// disruption under way (DisruptionUnderWay) that long after the claim.
	UnconfirmedTimeout time.Duration
	// Recorder, if set, receives a Warning event for each claim given back
	// unconfirmed, and one when the budget turns out to guard no node or
	// cannot be evaluated (warnings.go).
	Recorder events.EventRecorder
	// Claimer, if set, carries the status writes in its group commit with the
	// claims of the same process (see Claimer.Recompute); without it, the
	// controller writes on its own and races them.
	Claimer *Claimer
	// Signals are the configured signal taints (nil: the defaults).
	Signals *ngv1alpha1.Signals
	// DisruptionPending, if set, says whether the admitted disruption of a
	// node that does not show it yet is still on its way: Karpenter deletes
	// the Node of a NodeClaim whose deletion was charged only once the
	// NodeClaim's finalizer ran, which can take longer than ClaimTimeout
	// (karpenter.NodeClaimDeleting). A claim past ClaimTimeout is
	// kept while it answers true, as a node seen deleting keeps its claim.
	DisruptionPending func(ctx context.Context, node *corev1.Node) (bool, error)
	// Upgrades, if set, gives the AKS agent pools' upgrade settings: the
	// status then carries agentPools and the UpgradeSettingsFit condition
	// (upgrade.go), judged with UpgradeNodeTime (default
	// DefaultUpgradeNodeTime); UpgradeEvents says when the settings changed.
	Upgrades        upgrade.Source
	UpgradeEvents   <-chan event.GenericEvent
	UpgradeNodeTime time.Duration

	nodes *NodeLister
}

// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets/status,verbs=update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller: it reconciles a budget when the
// budget changes and when a node's labels, taints, readiness or deletion change.
func (r *StatusReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.nodes = NewNodeLister(mgr.GetCache())
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	if r.UpgradeNodeTime <= 0 {
		r.UpgradeNodeTime = DefaultUpgradeNodeTime
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("ndb-status").
		For(&ngv1alpha1.NodeDisruptionBudget{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allBudgets),
			builder.WithPredicates(nodeAvailabilityChanged(r.Signals)))
	if r.UpgradeEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.UpgradeEvents, handler.EnqueueRequestsFromMapFunc(r.allBudgets)))
	}
	return b.Complete(r)
}

// allBudgets maps a node change to every budget: a label change can move a node
// into or out of any budget's selector.
func (r *StatusReconciler) allBudgets(ctx context.Context, _ client.Object) []reconcile.Request {
	var list ngv1alpha1.NodeDisruptionBudgetList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil { // names only
		ctrl.LoggerFrom(ctx).Error(err, "Listing NodeDisruptionBudgets for a node change")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, b := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
	}
	return reqs
}

// nodeAvailabilityChanged passes node events that can change a budget, and
// drops the heartbeat status updates that make up most node traffic.
func nodeAvailabilityChanged(signals *ngv1alpha1.Signals) predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldNode, ok1 := e.ObjectOld.(*corev1.Node)
			newNode, ok2 := e.ObjectNew.(*corev1.Node)
			if !ok1 || !ok2 {
				return true
			}
			oldUnavailable, _ := Unavailable(oldNode, signals)
			newUnavailable, _ := Unavailable(newNode, signals)
			return oldUnavailable != newUnavailable || !maps.Equal(oldNode.Labels, newNode.Labels)
		},
	}
}

// Reconcile recomputes one budget's status.
func (r *StatusReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := r.Client.Get(ctx, req.NamespacedName, &ndb); err != nil {
		if client.IgnoreNotFound(err) == nil {
			forgetBudgetMetrics(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	selected, err := r.selectedNodes(ctx, &ndb)
	if err != nil {
		return reconcile.Result{}, err
	}
	claims := r.newClaimReview(&ndb, selected)
	if err := claims.readFresh(ctx, ndb.Status.DisruptedNodes, r.Clock.Now()); err != nil {
		return reconcile.Result{}, err
	}
	if r.Claimer != nil {
		return r.recomputeWithClaims(ctx, &ndb, selected, claims)
	}
	now := r.Clock.Now()
	status, requeueAt := r.computeStatus(&ndb, selected, claims, now)
	recordBudgetMetrics(ndb.Name, status)
	if !apiequality.Semantic.DeepEqual(status, ndb.Status) {
		before := ndb.Status
		ndb.Status = status
		// Update carries the resourceVersion we read: a claim written since then
		// makes this a conflict, and the retry counts it.
		if err := r.Client.Status().Update(ctx, &ndb); err != nil {
			return reconcile.Result{}, fmt.Errorf("updating NodeDisruptionBudget %s status: %w", ndb.Name, err)
		}
		r.reportUnconfirmed(ctx, &ndb, claims.unconfirmed)
		r.warnOnTransition(&ndb, &before, &status)
	}
	if requeueAt.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: requeueAt.Sub(now)}, nil
}

// recomputeWithClaims writes the status in the claims' next group-commit
// round, with the round's claims instead of racing them. It writes only if the
// round's budget is still the version this reconcile read with its nodes: the
// nodes are as old as that version, and a status computed from older nodes
// than a newer version's (which may have pruned a node seen deleting) could
// count that node available again. A newer version reconciles again anyway.
func (r *StatusReconciler) recomputeWithClaims(ctx context.Context, ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, claims *claimReview) (reconcile.Result, error) {
	now := r.Clock.Now()
	status, requeueAt := r.computeStatus(ndb, selected, claims, now)
	if apiequality.Semantic.DeepEqual(status, ndb.Status) {
		recordBudgetMetrics(ndb.Name, status)
		return requeueResult(now, requeueAt), nil // nothing to write: no round
	}
	var given []UnconfirmedClaim               // by the last run of fn that wrote
	var wrote *ngv1alpha1.NodeDisruptionBudget // what the last run of fn wrote, if anything
	err := r.Claimer.Recompute(ctx, ndb.Name, func(read *ngv1alpha1.NodeDisruptionBudget) bool {
		now, requeueAt, given, wrote = r.Clock.Now(), time.Time{}, nil, nil
		if read.ResourceVersion != ndb.ResourceVersion {
			return false
		}
		status, at := r.computeStatus(read, selected, claims, now)
		requeueAt = at
		recordBudgetMetrics(read.Name, status)
		if apiequality.Semantic.DeepEqual(status, read.Status) {
			return false
		}
		read.Status, given = status, claims.unconfirmed
		wrote = read.DeepCopy() // the round owns read
		return true
	})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("updating NodeDisruptionBudget %s status: %w", ndb.Name, err)
	}
	r.reportUnconfirmed(ctx, ndb, given)
	if wrote != nil {
		r.warnOnTransition(wrote, &ndb.Status, &wrote.Status)
	}
	return requeueResult(now, requeueAt), nil
}

func requeueResult(now, at time.Time) reconcile.Result {
	if at.IsZero() {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: at.Sub(now)}
}

func (r *StatusReconciler) selectedNodes(ctx context.Context, ndb *ngv1alpha1.NodeDisruptionBudget) ([]*corev1.Node, error) {
	sel, err := Selector(ndb)
	if err != nil {
		return nil, nil //nolint:nilerr // an invalid selector selects nothing; Evaluate reports it
	}
	return r.nodes.List(ctx, sel) // read only, no copies
}

// computeStatus returns the budget's new status, and when it must be recomputed
// even if nothing changes (a claim expiring, a window opening or closing).
func (r *StatusReconciler) computeStatus(ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, claims *claimReview, now time.Time) (ngv1alpha1.NodeDisruptionBudgetStatus, time.Time) {
	status := *ndb.Status.DeepCopy()
	status.ObservedGeneration = ndb.Generation
	var requeueAt time.Time
	status.DisruptedNodes, requeueAt = claims.prune(ndb.Status.DisruptedNodes, now)

	pruned := ndb.DeepCopy()
	pruned.Status.DisruptedNodes = status.DisruptedNodes
	n, err := Evaluate(pruned, claims.counted(selected), r.Signals, now)
	status.ExpectedNodes, status.CurrentAvailable = n.Expected, n.Available
	status.DesiredAvailable, status.DisruptionsAllowed = n.Desired, n.Allowed
	meta.SetStatusCondition(&status.Conditions, allowedCondition(n, err, ndb.Generation))
	if cond := windowsCondition(ndb, now); cond != nil {
		meta.SetStatusCondition(&status.Conditions, *cond)
	} else {
		meta.RemoveStatusCondition(&status.Conditions, ngv1alpha1.ConditionWindowsFire)
	}

	setUpgradeStatus(&status, ndb, selected, r.Upgrades, r.UpgradeNodeTime)

	if change := NextWindowChange(ndb.Spec.Windows, now); !change.IsZero() && (requeueAt.IsZero() || change.Before(requeueAt)) {
		requeueAt = change
	}
	return status, requeueAt
}

// reportUnconfirmed records the claims a status write gave back unconfirmed.
func (r *StatusReconciler) reportUnconfirmed(ctx context.Context, ndb *ngv1alpha1.NodeDisruptionBudget, given []UnconfirmedClaim) {
	for _, g := range given {
		unconfirmedClaims.WithLabelValues(ndb.Name).Inc()
		ctrl.LoggerFrom(ctx).Info("Gave back a disruption claim whose node showed no disruption",
			"ndb", klog.KObj(ndb), "node", g.Node, "claimedAt", g.ClaimedAt)
		if r.Recorder != nil {
			r.Recorder.Eventf(ndb, g.Seen, corev1.EventTypeWarning, ReasonClaimUnconfirmed, actionGiveBack,
				"gave back the disruption claim of node %s made at %s: the node showed no deletion within %s "+
					"(a delete denied after nodeguard admitted it, or a forged admission review)",
				g.Node, g.ClaimedAt.UTC().Format(time.RFC3339), r.UnconfirmedTimeout)
		}
	}
}
