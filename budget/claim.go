package budget

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// releaseTimeout bounds giving back a claim, which runs on its own context so
// that it happens even when the admission request's time is up.
const releaseTimeout = 5 * time.Second

// Denial is a budget's refusal of one more disruption.
type Denial struct {
	Budget  string
	Numbers Numbers
	// Code is 429 for "not now" (retrying later may succeed) and 403 for "not
	// allowed" (the budget as written allows no disruption at all).
	Code    int32
	Message string
}

func (d *Denial) Error() string { return d.Message }

// Claimer charges node disruptions to budgets the way the Eviction API charges
// pod disruptions to PodDisruptionBudgets: it reads the budget, checks that it
// allows one more disruption, and records the node in status.disruptedNodes in
// one status write with a resourceVersion precondition. That precondition is
// the only lock between replicas: concurrent writers conflict, re-read and
// re-check, so a budget never admits more than it allows.
//
// Within one replica, concurrent claims and releases on the same budget are
// group-committed (commit.go): one status write carries every waiting change
// that fits, each answered with its own verdict, so concurrent deletes cost
// about one write per round instead of a conflict storm. A Claimer must not be
// copied after first use.
type Claimer struct {
	// Client writes budget status.
	Client client.Client
	// Reader reads budgets fresh from the API server (not a cache).
	Reader client.Reader
	// Cache, if set, reads budgets from an informer. Claims start from its
	// copy when it is newer than the replica's own last write, saving a read;
	// a stale copy only costs a conflict and a fresh read.
	Cache client.Reader
	Clock clock.PassiveClock
	// Signals are the configured signal taints (nil: the defaults): a node
	// that carries one is already unavailable.
	Signals *ngv1alpha1.Signals
	// OnConflict, if set, is called for each conflicting status write that is
	// retried (one write may carry several claims).
	OnConflict func()

	mu     sync.Mutex
	queues map[string]*commitQueue
}

// NewClaimer returns the manager's claimer: it writes with the manager's
// client, reads fresh through its API reader and starts rounds from its cache.
// Share one per process between the DELETE webhook and the status controller
// (StatusReconciler.Claimer), so that their writes join instead of racing.
func NewClaimer(mgr ctrl.Manager, signals *ngv1alpha1.Signals) *Claimer {
	return &Claimer{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Cache: mgr.GetClient(),
		Clock: clock.RealClock{}, Signals: signals, OnConflict: CountClaimConflict}
}

// Claim charges one disruption of node to the named budget. It returns true
// when this call charged it, false when nothing was charged: the node was
// already charged (claims are idempotent, as admission may run more than once
// per delete), or it is already unavailable and the budget's
// unhealthyNodeDeletionPolicy lets it go without a charge. It returns a *Denial
// when the budget does not allow it, or an error. With dryRun it checks and
// writes nothing. When ctx ends before the claim is decided, it returns a 429
// Denial.
func (c *Claimer) Claim(ctx context.Context, budget string, node *corev1.Node, dryRun bool) (bool, error) {
	stamp, err := c.claim(ctx, budget, node, dryRun)
	return !stamp.IsZero(), err
}

// claim is Claim returning the stamp of the entry this call wrote (zero when
// it charged nothing), which a release of this claim names.
func (c *Claimer) claim(ctx context.Context, budget string, node *corev1.Node, dryRun bool) (metav1.Time, error) {
	if unavailable, why := Unavailable(node, c.Signals); unavailable || dryRun {
		_, err := c.evaluate(ctx, budget, node.Name, unavailable, why)
		return metav1.Time{}, err
	}
	v := c.submit(ctx, budget, change{node: node.Name})
	if v.err != nil {
		return metav1.Time{}, c.contextDenial(ctx, budget, v.err)
	}
	return v.stamp, nil
}

// evaluate decides a claim that writes nothing (a dry run, or a node already
// unavailable) from a fresh read of the budget.
func (c *Claimer) evaluate(ctx context.Context, budget, node string, unavailable bool, why string) (bool, error) {
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := c.Reader.Get(ctx, client.ObjectKey{Name: budget}, &ndb); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil // deleted since it was listed: nothing to charge
		}
		return false, c.contextDenial(ctx, budget, fmt.Errorf("reading NodeDisruptionBudget %q: %w", budget, err))
	}
	if _, charged := ndb.Status.DisruptedNodes[node]; charged {
		return false, nil
	}
	now := c.Clock.Now()
	if unavailable {
		return false, c.checkUnhealthy(&ndb, node, why, now)
	}
	_, err := c.check(&ndb, now)
	return err == nil, err
}

// check returns the budget's numbers if it allows one more disruption now, or
// a *Denial saying why not and what to do.
func (c *Claimer) check(ndb *ngv1alpha1.NodeDisruptionBudget, now time.Time) (Numbers, error) {
	deny := func(code int32, n Numbers, format string, args ...any) (Numbers, error) {
		return n, &Denial{Budget: ndb.Name, Numbers: n, Code: code, Message: fmt.Sprintf(format, args...)}
	}
	if ndb.Status.ObservedGeneration < ndb.Generation {
		return deny(http.StatusTooManyRequests, Numbers{},
			"NodeDisruptionBudget %q has not been evaluated since its last change; retry in a few seconds", ndb.Name)
	}
	n, err := FromStatus(ndb, now)
	if err != nil {
		return deny(http.StatusForbidden, n, "NodeDisruptionBudget %q is invalid (%v); fix it or delete it", ndb.Name, err)
	}
	switch {
	case n.Allowed > 0:
		return n, nil
	case n.Window != nil:
		return deny(http.StatusTooManyRequests, n,
			"NodeDisruptionBudget %q is in a disruption window (schedule %q) until %s: %s; retry after the window ends",
			ndb.Name, n.Window.Schedule, n.Window.Ends.UTC().Format(time.RFC3339), n)
	case n.Expected == 0:
		// Every claim is for a node the budget selects: a status that
		// counts none predates the node (a leader whose node watch lags
		// wrote it, at a hand-over), and says nothing to change.
		return deny(http.StatusTooManyRequests, n,
			"NodeDisruptionBudget %q counts none of its nodes yet: its status predates this node; retry in a few seconds", ndb.Name)
	case n.MaxUnavailable() == 0:
		return deny(http.StatusForbidden, n,
			"NodeDisruptionBudget %q allows no disruption of its %d nodes (%s); change the budget to delete this node",
			ndb.Name, n.Expected, n)
	default:
		return deny(http.StatusTooManyRequests, n,
			"NodeDisruptionBudget %q allows no more disruptions now: %s; retry when a disrupted node is back or gone (kubectl get ndb %s)",
			ndb.Name, n, ndb.Name)
	}
}

// checkUnhealthy applies the budget's unhealthyNodeDeletionPolicy to a node it
// already counts unavailable: deleting it consumes no disruption, under
// IfHealthyBudget only while the budget has its desired available nodes.
func (c *Claimer) checkUnhealthy(ndb *ngv1alpha1.NodeDisruptionBudget, node, why string, now time.Time) error {
	if ndb.Spec.UnhealthyNodeDeletionPolicy != ngv1alpha1.IfHealthyBudget {
		return nil
	}
	if ndb.Status.ObservedGeneration < ndb.Generation {
		return &Denial{Budget: ndb.Name, Code: http.StatusTooManyRequests, Message: fmt.Sprintf(
			"NodeDisruptionBudget %q (unhealthyNodeDeletionPolicy IfHealthyBudget) has not been evaluated since its last change; retry in a few seconds", ndb.Name)}
	}
	n, err := FromStatus(ndb, now)
	if err != nil {
		return &Denial{Budget: ndb.Name, Numbers: n, Code: http.StatusForbidden,
			Message: fmt.Sprintf("NodeDisruptionBudget %q is invalid (%v); fix it or delete it", ndb.Name, err)}
	}
	if n.Available >= n.Desired {
		return nil
	}
	return &Denial{Budget: ndb.Name, Numbers: n, Code: http.StatusTooManyRequests, Message: fmt.Sprintf(
		"node %s is already unavailable (%s), and NodeDisruptionBudget %q has unhealthyNodeDeletionPolicy IfHealthyBudget "+
			"while only %d of the %d nodes it wants are available (%s); retry when the budget is healthy, or set the policy to AlwaysAllow",
		node, why, ndb.Name, n.Available, n.Desired, n)}
}

// contextDenial turns an error after the admission time budget ran out into a
// 429 "try again", and passes other errors through.
func (c *Claimer) contextDenial(ctx context.Context, budget string, err error) error {
	if ctx.Err() == nil || errors.As(err, new(*Denial)) {
		return err
	}
	return &Denial{Budget: budget, Code: http.StatusTooManyRequests,
		Message: fmt.Sprintf("NodeDisruptionBudget %q is busy with concurrent node deletions; retry the delete", budget)}
}

// Recompute runs fn on the budget as the next group-commit round reads it, and
// writes what fn changed together with that round's claims and releases. fn
// changes the status in place and reports whether it changed anything; it may
// run more than once (again after a conflict, on a fresh read). A budget that
// is gone is no error.
func (c *Claimer) Recompute(ctx context.Context, budget string, fn func(*ngv1alpha1.NodeDisruptionBudget) bool) error {
	return c.submit(ctx, budget, change{recompute: fn}).err
}

// Release gives back the node's charge to the budget, whoever made it (a
// scale-down that is called off). It runs on its own context, bounded by
// releaseTimeout, so that it happens even when the admission's time is up; it
// joins the budget's group commit like a claim.
func (c *Claimer) Release(ctx context.Context, budget, node string) error {
	return c.release(ctx, budget, node, metav1.Time{})
}

// release gives back the node's charge; with a stamp, only while the entry
// carries it.
func (c *Claimer) release(ctx context.Context, budget, node string, stamp metav1.Time) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if v := c.submit(ctx, budget, change{node: node, release: true, stamp: stamp}); v.err != nil {
		return fmt.Errorf("releasing node %s from NodeDisruptionBudget %q: %w", node, budget, v.err)
	}
	return nil
}
