package taintwatch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/kube/requeue"
)

const (
	// watcherWorkers is how many nodes the watcher reconciles at once.
	watcherWorkers = 16
	// restorePollInterval is how often a node being restored to None is
	// checked for Azure's confirmation (an in-memory check, no API call).
	restorePollInterval = time.Second
	// restoreFailedInterval is how long to wait after the manager gave up on
	// None; its resync (--azure-admin-state-resync) tries again meanwhile.
	restoreFailedInterval = 30 * time.Second
)

// Watcher is the taint watcher: it hands every node whose signals changed to
// the admin-state manager, and keeps the signal gauges.
type Watcher struct {
	Client client.Client
	// AdminState is the admin-state manager; nil when Azure is not
	// configured, in which case only the gauges are kept.
	AdminState *azure.Manager
	Recorder   events.EventRecorder
	Clock      clock.Clock
	// Signals are the configured signal taints and who acts on them.
	Signals azure.Signals

	mu sync.Mutex
	// nodes is what the watcher knows of each node, by name.
	nodes map[string]*nodeRecord
	// counts per signal, and of held nodes, for the gauges.
	counts map[string]int
	held   int
}

// nodeRecord is the watcher's memory of one node.
type nodeRecord struct {
	uid     types.UID
	signals []string
	held    bool
	// tracked: the admin-state manager holds a desired state for uid that the
	// watcher set.
	tracked bool
	desired azure.AdminState
}

// SetupWithManager registers the watcher on Nodes, filtered to changes of
// its inputs.
func (w *Watcher) SetupWithManager(mgr ctrl.Manager) error {
	if w.Clock == nil {
		w.Clock = clock.RealClock{}
	}
	w.nodes = map[string]*nodeRecord{}
	w.counts = map[string]int{}
	return ctrl.NewControllerManagedBy(mgr).
		Named("signal-taint-watcher").
		For(&corev1.Node{}, builder.WithPredicates(inputsChanged(w.Signals))).
		// A burst of taints (a scale-down, a zone outage) records each
		// node's hold in parallel, so their Downs go into the same writes.
		WithOptions(controller.Options{MaxConcurrentReconciles: watcherWorkers}).
		Complete(w)
}

// inputsChanged passes creates, deletes and generic events, and only the
// updates that change the watcher's inputs.
func inputsChanged(signals azure.Signals) predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		return !ok1 || !ok2 || inputsOf(o, signals) != inputsOf(n, signals)
	}}
}

// Reconcile records the node's signals, then sets its desired admin state:
// Down while azure.DesiredState says so, None (restored) only where nodeguard
// took it Down and no signal taint that nodeguard or the cloud provider
// honours is left (Signals.Table.HoldsAdminState).
func (w *Watcher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := w.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		if apierrors.IsNotFound(err) {
			if w.forget(req.Name) && w.AdminState != nil {
				// cloud-provider-azure rewrites the pools for a node set change.
				w.AdminState.ClusterChanged()
			}
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	rec, joined := w.observe(&node)
	if w.AdminState == nil {
		return reconcile.Result{}, nil
	}
	if joined {
		w.AdminState.ClusterChanged()
	}
	// Whatever its state: a gone node of its name has its Down restored now.
	w.AdminState.Observe(&node)
	if w.Signals.DesiredState(&node) == azure.AdminStateDown {
		return w.holdDown(ctx, &node, rec)
	}
	if w.Signals.Table.HoldsAdminState(&node) {
		// A signal taint that nodeguard or the cloud provider honours is
		// still on: whatever state nodeguard asked for stays.
		return reconcile.Result{}, nil
	}
	return w.restore(ctx, &node, rec)
}

// observe updates the watcher's memory and the gauges, and reports whether
// the node is new to it (or new under its name). A node that replaced
// another of the same name never inherits its state: the old UID is
// forgotten by the manager.
func (w *Watcher) observe(n *corev1.Node) (nodeRecord, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.nodes[n.Name]
	joined := !ok || rec.uid != n.UID
	if !ok {
		rec = &nodeRecord{uid: n.UID}
		w.nodes[n.Name] = rec
	}
	if rec.uid != n.UID {
		w.forgetLocked(rec)
		rec = &nodeRecord{uid: n.UID}
		w.nodes[n.Name] = rec
	}
	w.count(rec, -1)
	rec.signals, rec.held = signalsOf(n, w.Signals.Table), heldDown(n)
	w.count(rec, +1)
	return *rec, joined
}

// forget drops a deleted node. The manager restores the entries it recorded
// Down for it once a node of the same name replaces it, or after the
// gone-node grace period (its VM may still be going away).
// It reports whether the watcher knew the node.
func (w *Watcher) forget(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	rec, ok := w.nodes[name]
	if ok {
		w.forgetLocked(rec)
		delete(w.nodes, name)
	}
	return ok
}

func (w *Watcher) forgetLocked(rec *nodeRecord) {
	w.count(rec, -1)
	rec.signals, rec.held = nil, false
	if rec.tracked && w.AdminState != nil {
		w.AdminState.Forget(rec.uid)
	}
	rec.tracked, rec.desired = false, ""
}

// count adds a record to the gauges (d = +1) or removes it (d = -1). Call
// with w.mu held.
func (w *Watcher) count(rec *nodeRecord, d int) {
	for _, s := range rec.signals {
		w.counts[s] += d
	}
	if rec.held {
		w.held += d
	}
	for _, s := range allSignals(w.Signals.Table) {
		nodesSignalled.WithLabelValues(s).Set(float64(w.counts[s]))
	}
	nodesHeldDown.Set(float64(w.held))
}

func (w *Watcher) track(n *corev1.Node, state azure.AdminState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec, ok := w.nodes[n.Name]; ok && rec.uid == n.UID {
		rec.tracked, rec.desired = true, state
	}
}

func (w *Watcher) untrack(n *corev1.Node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rec, ok := w.nodes[n.Name]; ok && rec.uid == n.UID {
		if rec.tracked {
			w.AdminState.Forget(rec.uid)
		}
		rec.tracked, rec.desired = false, ""
	}
}

// holdDown records durably that nodeguard takes the node Down (before asking,
// so that a crash in between can never leave an entry Down that nobody
// restores), then hands the node to the manager. A node being deleted gets no
// record and no event: its deletion cannot be undone, so nothing restores
// None while it exists (the manager's records do once it is gone), and the
// termination controller reports its cut. That write would also land as the
// termination controller cordons the node.
func (w *Watcher) holdDown(ctx context.Context, n *corev1.Node, rec nodeRecord) (reconcile.Result, error) {
	if n.DeletionTimestamp == nil && !heldDown(n) {
		patch := client.MergeFrom(n.DeepCopy())
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[ngv1alpha1.AdminStateDownAnnotation] = ngv1alpha1.FormatTime(w.Clock.Now())
		if err := w.Client.Patch(ctx, n, patch); err != nil {
			if apierrors.IsNotFound(err) {
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, fmt.Errorf("recording admin state Down on node %s: %w", n.Name, err)
		}
		w.event(n, ReasonAdminStateDownRequested, "signals %s: asked Azure to set the node's load-balancer backend entries Down; nodeguard restores None once every signal is gone", w.describe(rec.signals))
	}
	if !rec.tracked || rec.desired != azure.AdminStateDown {
		adminStateRequests.WithLabelValues(string(azure.AdminStateDown)).Inc()
		ctrl.LoggerFrom(ctx).Info("Node carries a signal; setting load-balancer admin state Down", "node", klog.KObj(n), "signals", rec.signals)
	}
	w.AdminState.SetDesired(n, azure.AdminStateDown)
	w.track(n, azure.AdminStateDown)
	return reconcile.Result{}, nil
}

// restore sets None on a node nodeguard took Down, and once Azure confirmed
// it, removes the record and forgets the node: from then on nodeguard leaves
// its entries alone. A node nodeguard never took Down is not touched.
func (w *Watcher) restore(ctx context.Context, n *corev1.Node, rec nodeRecord) (reconcile.Result, error) {
	if n.DeletionTimestamp != nil {
		// Going away: once it is gone, the manager restores what it recorded.
		return reconcile.Result{}, nil
	}
	if !heldDown(n) {
		// Never ours, or the record was removed by hand: hands off.
		w.untrack(n)
		return reconcile.Result{}, nil
	}
	if !rec.tracked || rec.desired != azure.AdminStateNone {
		adminStateRequests.WithLabelValues(string(azure.AdminStateNone)).Inc()
		ctrl.LoggerFrom(ctx).Info("Node signals are gone; restoring load-balancer admin state None", "node", klog.KObj(n))
		w.event(n, ReasonAdminStateRestoreRequested, "Every signal is gone: asked Azure to restore None on the load-balancer backend entries nodeguard set Down")
	}
	w.AdminState.SetDesired(n, azure.AdminStateNone)
	w.track(n, azure.AdminStateNone)
	done, err := w.confirmed(n.UID, azure.AdminStateNone)
	switch {
	case err != nil:
		// The manager reported the failure on the node; its resync retries.
		ctrl.LoggerFrom(ctx).V(1).Info("Restoring admin state None failed; waiting for the admin-state resync", "node", klog.KObj(n), "error", err.Error())
		return reconcile.Result{RequeueAfter: restoreFailedInterval}, nil
	case !done:
		return reconcile.Result{RequeueAfter: restorePollInterval}, nil
	}
	// Optimistic lock: a signal that arrived meanwhile makes this conflict,
	// and the retry takes the node Down again.
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(n.Annotations, ngv1alpha1.AdminStateDownAnnotation)
	if err := w.Client.Patch(ctx, n, patch); err != nil {
		if again, lost := requeue.OnConflict(err); lost {
			return again, nil
		}
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("releasing admin state of node %s: %w", n.Name, err)
	}
	w.untrack(n)
	adminStateReleases.Inc()
	w.event(n, ReasonAdminStateReleased, "Azure confirmed None on the node's load-balancer backend entries; nodeguard no longer manages them")
	return reconcile.Result{}, nil
}

// confirmed asks the manager, without waiting, whether Azure confirmed state
// on every entry of the node. It returns the manager's error when applying
// the state failed for good.
func (w *Watcher) confirmed(uid types.UID, state azure.AdminState) (bool, error) {
	switch answer, err := w.AdminState.Confirmation(context.Background(), uid, state, 0); answer {
	case azure.Confirmed:
		return true, nil
	case azure.ConfirmFailed:
		return false, err
	}
	return false, nil // pending, or stopped or forgotten: the next pass sees
}

func (w *Watcher) event(n *corev1.Node, reason, note string, args ...any) {
	if w.Recorder != nil {
		w.Recorder.Eventf(n, nil, corev1.EventTypeNormal, reason, actionAdminState, note, args...)
	}
}

// describe lists signals for an event note.
func (w *Watcher) describe(signals []string) string {
	if len(signals) == 0 {
		return "(none)"
	}
	out := make([]string, 0, len(signals))
	for _, s := range signals {
		out = append(out, signalText(s, w.Signals.Table))
	}
	return strings.Join(out, ", ")
}

// signalText describes a signal for event notes.
func signalText(signal string, signals *ngv1alpha1.Signals) string {
	switch signal {
	case signalDraining:
		return "taint " + ngv1alpha1.DrainingTaintKey
	case signalDeleting:
		return "being deleted under finalizer " + ngv1alpha1.TerminationFinalizer
	case signalDrained:
		return "drain charged to its budgets (" + ngv1alpha1.DrainChargedAtAnnotation + ")"
	}
	for _, s := range signals.Taints() {
		if s.Signal == signal {
			return "taint " + s.String()
		}
	}
	return signal
}
