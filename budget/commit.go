package budget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// The group commit of claims, releases and the status controller's writes on
// one budget within one replica.
//
// Every change joins its budget's queue. One committer per budget (a goroutine
// that lives while the queue has work) takes everything waiting, applies it in
// arrival order to one read of the budget, and writes the result in one status
// write with the resourceVersion it read. Changes that arrive meanwhile wait
// for the next round. On a conflict the round is redone from a fresh read,
// with whatever has arrived since.
//
// A round starts from a copy it already has: the newer of the object this
// replica's last successful write returned and the informer's (Claimer.Cache),
// which sees other writers' changes (the status controller's, other
// replicas') within milliseconds. The resourceVersion precondition makes a
// stale copy harmless: it can only cause a conflict, never an admission beyond
// the budget. After a conflict the round reads fresh from the API server. A
// round that would write nothing (every claim denied or already charged)
// proves nothing about its copy, so a copy is then replaced by a fresh read
// before anyone is answered.

const (
	// roundTimeout bounds a round whose waiters have no deadline of their own.
	roundTimeout = 10 * time.Second
	// recomputeDelay is how long a status write waits for a claim to share
	// it, while claims are coming (within claimBurstWindow): a few claims'
	// arrival gaps during a burst of deletes, and small beside the status
	// controller's own reaction time (a node turns NotReady only after tens of
	// seconds without a heartbeat).
	recomputeDelay   = 100 * time.Millisecond
	claimBurstWindow = time.Second
	// claimInFlight bounds how long the request that made a claim may still
	// give it back: its admission's time (the webhooks' timeoutSeconds, at
	// most 30 s) and then releaseTimeout, with room for replicas' clocks.
	claimInFlight = time.Minute
)

// change is one claim (charge node), release (give node back), or status
// recomputation (recompute changes the budget's status in place and reports
// whether it changed anything). A release with a stamp gives the node back
// only while its entry still carries that stamp: it is the claim the
// releasing request made, not one another request made or relies on.
type change struct {
	node      string
	release   bool
	stamp     metav1.Time
	recompute func(*ngv1alpha1.NodeDisruptionBudget) bool
}

// verdict answers one change: charged is true when a claim charged its node,
// and stamp is the entry it wrote; err is a *Denial or a failure.
type verdict struct {
	charged bool
	stamp   metav1.Time
	err     error
}

// waiter is a change waiting for its verdict.
type waiter struct {
	ctx context.Context
	change
	done chan verdict // buffered: the committer never blocks on a waiter that gave up
}

// commitQueue is one budget's group commit.
type commitQueue struct {
	pending []*waiter
	// committing is true while a committer runs for this budget.
	committing bool
	// last is the budget as this replica last wrote or freshly read it, and
	// conflicted says the last round lost a race: the next one reads fresh.
	// Only the committer touches them.
	last       *ngv1alpha1.NodeDisruptionBudget
	conflicted bool
	// kick wakes a committer holding status recomputations for a claim;
	// lastClaim is when the last claim or release came.
	kick      chan struct{}
	lastClaim time.Time
}

// submit queues a change on the budget and waits for its verdict, or for ctx
// to end (then the verdict is ctx's error).
func (c *Claimer) submit(ctx context.Context, budget string, ch change) verdict {
	w := &waiter{ctx: ctx, change: ch, done: make(chan verdict, 1)}
	c.mu.Lock()
	if c.queues == nil {
		c.queues = map[string]*commitQueue{}
	}
	q := c.queues[budget]
	if q == nil {
		q = &commitQueue{kick: make(chan struct{}, 1)}
		c.queues[budget] = q
	}
	q.pending = append(q.pending, w)
	if ch.recompute == nil {
		q.lastClaim = c.Clock.Now()
		select {
		case q.kick <- struct{}{}:
		default: // a kick is already pending
		}
	}
	start := !q.committing
	q.committing = true
	c.mu.Unlock()
	if start {
		go c.commit(budget, q)
	}
	if ch.recompute == nil {
		defer func(began time.Time) { claimDuration.Observe(c.Clock.Since(began).Seconds()) }(c.Clock.Now())
	}
	select {
	case v := <-w.done:
		return v
	case <-ctx.Done():
		select {
		case v := <-w.done: // decided as ctx ended: the verdict is the truth
			return v
		default:
			return verdict{err: ctx.Err()}
		}
	}
}

// commit runs rounds until no live waiter is left.
func (c *Claimer) commit(budget string, q *commitQueue) {
	waited := false
	for {
		batch := c.take(budget, q)
		if len(batch) == 0 {
			return
		}
		if !waited && recomputesOnly(changesOf(batch)) && c.claimedRecently(q) {
			c.requeue(q, batch)
			c.awaitClaim(q)
			waited = true
			continue
		}
		waited = false
		if retry := c.round(budget, q, batch); len(retry) > 0 {
			c.requeue(q, retry)
		}
	}
}

// claimedRecently reports whether a claim or release came within
// claimBurstWindow: only then is one likely to come within recomputeDelay.
func (c *Claimer) claimedRecently(q *commitQueue) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !q.lastClaim.IsZero() && c.Clock.Since(q.lastClaim) < claimBurstWindow
}

// awaitClaim holds a round of status recomputations alone for up to
// recomputeDelay, until a claim or release arrives to share its write: a
// recomputation's own write would make the claims arriving meanwhile wait a
// whole round.
func (c *Claimer) awaitClaim(q *commitQueue) {
	t := time.NewTimer(recomputeDelay)
	defer t.Stop()
	select {
	case <-q.kick:
	case <-t.C:
	}
}

// take returns every waiter still waiting, or none and ends the committer;
// then a queue that keeps no copy of its budget (gone, or after a failure) is
// forgotten.
func (c *Claimer) take(budget string, q *commitQueue) []*waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*waiter
	for _, w := range q.pending {
		if w.ctx.Err() == nil {
			batch = append(batch, w)
		}
	}
	q.pending = nil
	if len(batch) == 0 {
		q.committing = false
		if q.last == nil {
			delete(c.queues, budget)
		}
	}
	return batch
}

// requeue puts a conflicted batch back ahead of the waiters that came since.
func (c *Claimer) requeue(q *commitQueue, batch []*waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q.pending = append(batch, q.pending...)
}

// round decides a batch with one read and at most one write. It returns the
// batch when the write conflicted, to be redone with a fresh read.
func (c *Claimer) round(budget string, q *commitQueue, batch []*waiter) []*waiter {
	ctx, cancel := roundContext(batch)
	defer cancel()
	changes := changesOf(batch)
	var base *ngv1alpha1.NodeDisruptionBudget
	if !q.conflicted {
		base = c.newestCopy(ctx, budget, q.last)
	}
	q.conflicted = false
	fresh := false
	for {
		if base == nil {
			var err error
			if base, err = c.read(ctx, budget); err != nil || base == nil {
				q.last = nil
				answer(batch, verdicts(len(batch), err)) // nil base: the budget is gone, nothing to charge
				return nil
			}
			fresh = true
		}
		next, vs, changed := c.apply(base, changes, c.Clock.Now())
		if !changed {
			if !fresh && !recomputesOnly(changes) {
				base = nil // a copy that wrote nothing proves nothing: read it fresh
				continue
			}
			q.last = base
			answer(batch, vs)
			return nil
		}
		began := c.Clock.Now()
		err := c.Client.Status().Update(ctx, next)
		statusWriteDuration.Observe(c.Clock.Since(began).Seconds())
		switch {
		case err == nil:
			q.last = next
			if n := countChanged(vs, changes); n > 0 {
				claimBatchSize.Observe(float64(n))
			}
			answer(batch, vs)
			return nil
		case apierrors.IsNotFound(err):
			q.last = nil
			answer(batch, verdicts(len(batch), nil))
			return nil
		case apierrors.IsConflict(err) && ctx.Err() == nil:
			q.last, q.conflicted = nil, true
			if c.OnConflict != nil {
				c.OnConflict()
			}
			return batch
		default:
			q.last = nil
			answer(batch, failed(vs, fmt.Errorf("writing the status of NodeDisruptionBudget %q: %w", budget, err)))
			return nil
		}
	}
}

// read gets the budget fresh from the API server; nil when it is gone.
func (c *Claimer) read(ctx context.Context, budget string) (*ngv1alpha1.NodeDisruptionBudget, error) {
	claimFreshReads.Inc()
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := c.Reader.Get(ctx, client.ObjectKey{Name: budget}, &ndb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading NodeDisruptionBudget %q: %w", budget, err)
	}
	return &ndb, nil
}

// newestCopy returns the newer of last and the informer's copy of the budget,
// or nil when there is neither. ResourceVersions are opaque: comparing them as
// numbers (which they are in etcd-backed API servers) is only a guess at which
// copy is newer, and a wrong guess costs a conflict, never correctness.
func (c *Claimer) newestCopy(ctx context.Context, budget string, last *ngv1alpha1.NodeDisruptionBudget) *ngv1alpha1.NodeDisruptionBudget {
	if c.Cache == nil {
		return last
	}
	var cached ngv1alpha1.NodeDisruptionBudget
	if err := c.Cache.Get(ctx, client.ObjectKey{Name: budget}, &cached); err != nil {
		return last
	}
	if last == nil {
		return &cached
	}
	lastRV, err1 := strconv.ParseUint(last.ResourceVersion, 10, 64)
	cachedRV, err2 := strconv.ParseUint(cached.ResourceVersion, 10, 64)
	if err1 == nil && err2 == nil && cachedRV > lastRV {
		return &cached
	}
	return last
}

func changesOf(batch []*waiter) []change {
	changes := make([]change, len(batch))
	for i, w := range batch {
		changes[i] = w.change
	}
	return changes
}

// recomputesOnly reports whether the batch holds only status recomputations:
// when they change nothing, the copy they read is as good as the informer's
// the status controller always compared against, and no verdict hangs on it.
func recomputesOnly(changes []change) bool {
	for _, ch := range changes {
		if ch.recompute == nil {
			return false
		}
	}
	return true
}

// countChanged is how many changes a write carried: claims charged and
// releases (a release that found nothing to give back counts too; it is rare).
func countChanged(vs []verdict, changes []change) int {
	n := 0
	for i, v := range vs {
		if v.charged || changes[i].release {
			n++
		}
	}
	return n
}

// failed keeps each denial (decided from a read the failed write cannot
// undo) and gives everyone else the write's error.
func failed(vs []verdict, err error) []verdict {
	out := make([]verdict, len(vs))
	for i, v := range vs {
		if errors.As(v.err, new(*Denial)) {
			out[i] = v
		} else {
			out[i].err = err
		}
	}
	return out
}

func verdicts(n int, err error) []verdict {
	vs := make([]verdict, n)
	for i := range vs {
		vs[i].err = err
	}
	return vs
}

func answer(batch []*waiter, vs []verdict) {
	for i, w := range batch {
		w.done <- vs[i]
	}
}

// roundContext lives as long as the batch's most patient waiter: a round must
// not fail the waiters with time left because the first one has none.
func roundContext(batch []*waiter) (context.Context, context.CancelFunc) {
	var deadline time.Time
	for _, w := range batch {
		d, ok := w.ctx.Deadline()
		if !ok {
			d = time.Now().Add(roundTimeout)
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), deadline)
}
