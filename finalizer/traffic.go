package finalizer

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
)

// TrafficCutFailurePolicy is what a drain does when the node's traffic cut
// failed for good or was not confirmed within --admin-state-timeout.
type TrafficCutFailurePolicy string

const (
	// TrafficCutFailureDrain drains anyway (the default): a misconfigured or
	// unreachable Azure must not hold every node delete forever. The node
	// condition nodeguard.io/TrafficCut, a Warning event and
	// nodeguard_traffic_cuts_total say that traffic was not cut, and why.
	TrafficCutFailureDrain TrafficCutFailurePolicy = "drain"
	// TrafficCutFailureWait keeps the drain waiting until Azure confirms Down
	// (the admin-state resync retries the write).
	TrafficCutFailureWait TrafficCutFailurePolicy = "wait"
)

// Traffic cut outcomes (values of the metric label "result").
const (
	cutConfirmed = "confirmed"
	cutFailed    = "failed"
	cutTimedOut  = "timed_out"
	cutNoPool    = "no_backend_pool"
)

// Reasons of the TrafficCut condition.
const (
	conditionCut      = "AdminStateDown"
	conditionFailed   = "AdminStateUpdateFailed"
	conditionTimedOut = "AdminStateNotConfirmed"
	conditionNoPool   = ngv1alpha1.TrafficCutReasonNoPool
)

// trafficFailedPoll is how often a drain held by --traffic-cut-failure=wait
// looks again (an in-memory check): the admin-state resync retries the
// write meanwhile.
const trafficFailedPoll = 5 * time.Second

// notCut is a traffic cut that did not happen: its outcome and why.
type notCut struct {
	result, reason, why string
}

// cutTraffic asks for AdminState Down and waits until Azure confirms it on
// every backend pool of the node, or every pool confirmed or failed, for at
// most AdminStateTimeout from the cordon: an ARM outage never wedges a drain
// unless --traffic-cut-failure=wait asks for it. The TrafficCut condition
// records how the phase ended, in the pass's status write (no write of the
// node of its own); then it waits CutoverPause.
func (r *Reconciler) cutTraffic(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if r.AdminState == nil {
		return reconcile.Result{}, nil
	}
	if cutAt, ok := r.cutEnded(node); ok {
		// A confirmed cut may since have lost entries to their owner
		// (CutNote): the condition says so.
		if c := nodeCondition(node, ngv1alpha1.TrafficCutCondition); c != nil && c.Status == corev1.ConditionTrue {
			r.markCutConfirmed(node)
		}
		if wait := cutAt.Add(r.Opts.CutoverPause).Sub(r.Clock.Now()); wait > 0 {
			r.waitFor(node.UID, "traffic cut; pausing %s (--cutover-pause) before the drain", wait.Round(time.Second))
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		return reconcile.Result{}, nil
	}
	r.AdminState.SetDesired(node, azure.AdminStateDown)
	failure, res, err := r.awaitCut(ctx, node)
	if err != nil || !res.IsZero() {
		return res, err
	}
	if failure == nil && r.AdminState.NothingCut(node.UID) {
		r.reportNoPool(node)
		failure = &notCut{result: cutNoPool}
	}
	if failure != nil && failure.result != cutNoPool && r.Opts.TrafficCutFailure == TrafficCutFailureWait {
		return r.holdUncut(ctx, node, *failure)
	}
	r.reportCut(node, failure)
	r.mu.Lock()
	r.remember(node.UID).cutEnded = r.Clock.Now()
	r.mu.Unlock()
	if r.Opts.CutoverPause > 0 {
		r.waitFor(node.UID, "traffic cut; pausing %s (--cutover-pause) before the drain", r.Opts.CutoverPause)
		return reconcile.Result{RequeueAfter: r.Opts.CutoverPause}, nil
	}
	return reconcile.Result{}, nil
}

// cutEnded reports whether and when the node's traffic cut ended, from the
// TrafficCut condition, to the nanosecond when this process saw it end (a
// pause resumed after a restart may end up to a second early).
func (r *Reconciler) cutEnded(node *corev1.Node) (time.Time, bool) {
	at, ok := ngv1alpha1.TrafficCutEnded(node, r.Opts.TrafficCutFailure == TrafficCutFailureWait)
	if !ok {
		return at, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.recall(node.UID); !m.cutEnded.IsZero() {
		return m.cutEnded, true
	}
	return at, true
}

// awaitCut reads the manager's answer: confirmed (nil, zero), not cut (the
// failure), or still waiting within AdminStateTimeout (a requeue).
func (r *Reconciler) awaitCut(ctx context.Context, node *corev1.Node) (*notCut, reconcile.Result, error) {
	state, err := r.AdminState.Confirmation(ctx, node.UID, azure.AdminStateDown, 200*time.Millisecond)
	switch state {
	case azure.Confirmed:
		return nil, reconcile.Result{}, nil
	case azure.ConfirmFailed:
		return &notCut{result: cutFailed, reason: conditionFailed, why: err.Error()}, reconcile.Result{}, nil
	case azure.ConfirmPending:
		deadline := terminationStarted(node).Add(r.Opts.AdminStateTimeout)
		if left := deadline.Sub(r.Clock.Now()); left > 0 {
			r.waitFor(node.UID, "waiting for Azure to confirm load-balancer AdminState Down on every backend pool of the node; %s in %s (--admin-state-timeout)",
				r.pastTimeout(), left.Round(time.Second))
			next := azure.ConfirmationPoll
			if r.wakeWhenConfirmed(ctx, node, left) {
				// Woken when Azure answers: a hundred admitted nodes polling
				// every second would hold the workers the drains need.
				next = min(left, trafficWakeBackstop)
			}
			return nil, reconcile.Result{RequeueAfter: next}, nil
		}
		why := fmt.Sprintf("Azure did not confirm AdminState Down within --admin-state-timeout (%s)", r.Opts.AdminStateTimeout)
		return &notCut{result: cutTimedOut, reason: conditionTimedOut, why: why}, reconcile.Result{}, nil
	}
	return nil, reconcile.Result{}, err
}

// pastTimeout says what happens past --admin-state-timeout.
func (r *Reconciler) pastTimeout() string {
	if r.Opts.TrafficCutFailure == TrafficCutFailureWait {
		return "still waiting (--traffic-cut-failure=wait)"
	}
	return "draining anyway"
}

// reportCut says, once per node, how the traffic cut ended before the drain
// goes on: the TrafficCut condition, an event and the metric.
func (r *Reconciler) reportCut(node *corev1.Node, failure *notCut) {
	if failure != nil && failure.result == cutNoPool {
		return // reportNoPool said it
	}
	if failure == nil {
		if r.once(node.UID, "traffic-"+cutConfirmed) {
			trafficCuts.WithLabelValues(cutConfirmed).Inc()
		}
		r.markCutConfirmed(node)
		return
	}
	if r.once(node.UID, "traffic-"+failure.result) {
		trafficCuts.WithLabelValues(failure.result).Inc()
		r.event(node, corev1.EventTypeWarning, failure.eventReason(),
			"traffic NOT cut: %s; draining anyway (--traffic-cut-failure=drain): the node's pods are evicted while its load-balancer backend entries still take new connections", failure.why)
	}
	r.setTrafficCondition(node, corev1.ConditionFalse, failure.reason, "traffic NOT cut, drained anyway (--traffic-cut-failure=drain): "+failure.why)
}

// reportNoPool says that the node's traffic was not cut because no backend
// pool holds it: the TrafficCut condition and the metric. The drain goes on
// under either --traffic-cut-failure (there is nothing to wait for); the
// admin-state manager's LoadBalancerAdminStateNoBackendPool event says why.
func (r *Reconciler) reportNoPool(node *corev1.Node) {
	if r.once(node.UID, "traffic-"+cutNoPool) {
		trafficCuts.WithLabelValues(cutNoPool).Inc()
	}
	r.setTrafficCondition(node, corev1.ConditionFalse, conditionNoPool,
		"traffic NOT cut: the node is in no backend pool of the load balancers nodeguard manages (see the LoadBalancerAdminStateNoBackendPool event); draining, as there is nothing to cut")
}

// holdUncut keeps the drain waiting for the cut (--traffic-cut-failure=wait).
func (r *Reconciler) holdUncut(ctx context.Context, node *corev1.Node, failure notCut) (reconcile.Result, error) {
	if r.once(node.UID, "traffic-"+failure.result) {
		trafficCuts.WithLabelValues(failure.result).Inc()
		r.event(node, corev1.EventTypeWarning, failure.eventReason(),
			"traffic NOT cut: %s; the drain waits until Azure confirms AdminState Down (--traffic-cut-failure=wait)", failure.why)
	}
	msg := "traffic NOT cut, the drain waits (--traffic-cut-failure=wait): " + failure.why
	r.setTrafficCondition(node, corev1.ConditionFalse, failure.reason, msg)
	r.waitFor(node.UID, "%s", msg)
	return reconcile.Result{RequeueAfter: trafficFailedPoll}, nil
}

// eventReason is the Warning event's reason.
func (n notCut) eventReason() string {
	if n.result == cutFailed {
		return ReasonTrafficCutFailed
	}
	return ReasonTrafficCutTimedOut
}

// cutConfirmedNote says the cut was confirmed, in the TrafficCut condition and
// the NodeReleased event.
const cutConfirmedNote = "load balancer AdminState Down confirmed on every backend pool entry of the node"

// markCutConfirmed sets the TrafficCut condition True, or turns one that
// said "not cut" (a drain that waited) True.
func (r *Reconciler) markCutConfirmed(node *corev1.Node) {
	message := cutConfirmedNote
	if note := r.AdminState.CutNote(node.UID); note != "" {
		message += "; " + note
	}
	if c := nodeCondition(node, ngv1alpha1.TrafficCutCondition); c != nil && c.Status == corev1.ConditionTrue && c.Message == message {
		return
	}
	r.setTrafficCondition(node, corev1.ConditionTrue, conditionCut, message)
}

func (r *Reconciler) setTrafficCondition(node *corev1.Node, status corev1.ConditionStatus, reason, message string) {
	if c := nodeCondition(node, ngv1alpha1.TrafficCutCondition); c != nil && c.Status == status && c.Reason == reason && c.Message == message {
		return
	}
	r.stageCondition(node, corev1.NodeCondition{
		Type: ngv1alpha1.TrafficCutCondition, Status: status, Reason: reason, Message: message,
	})
}

// wakeWhenConfirmed waits in the background, for at most wait, until Azure
// confirms the node's AdminState Down (or it fails), and then wakes the
// node: the drain starts as soon as the cut is confirmed, not a poll later.
// It reports whether the node will be woken (one wait per node at a time).
func (r *Reconciler) wakeWhenConfirmed(ctx context.Context, node *corev1.Node, wait time.Duration) (waking bool) {
	if r.wakeups == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(node.UID)
	if m.cutWait {
		return true
	}
	m.cutWait = true
	go func() {
		waitCtx, cancel := context.WithTimeout(ctx, wait)
		_ = r.AdminState.WaitConfirmed(waitCtx, node.UID, azure.AdminStateDown) // the pass reads the outcome
		cancel()
		r.mu.Lock()
		if m := r.memory[node.UID]; m != nil {
			m.cutWait = false // before the wake: its pass may wait again
		}
		r.mu.Unlock()
		wakeNode(ctx, r.wakeups, node.Name)
	}()
	return true
}
