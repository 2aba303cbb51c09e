package azure

import (
	"time"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

// conflictDelay is how long a pool waits after its n-th 412 in a row: the
// first is re-read at once (it is the normal answer to If-Match after
// another writer's change); a run of them backs off, up to the retry
// interval, so that two writers never spin against each other.
func conflictDelay(n int, ceiling time.Duration) time.Duration {
	if n <= 1 {
		return 0
	}
	d := 250 * time.Millisecond
	for i := 2; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// applyRetriable spends one retry of every participant; those out of
// retries fail until their backoff passes. Call with m.mu held.
func (m *Manager) applyRetriable(g group, err error, now, at time.Time) []pendingEvent {
	var events []pendingEvent
	exhausted := false
	msg := armclient.Summary(err)
	m.eachPending(g, func(n *nodeState, w *work) {
		if w.retries >= m.cfg.MaxRetries {
			exhausted = true
			n.failed = &UpdateFailedError{Pool: g.pool.key, Retries: w.retries, Err: err}
			if m.fail(n, w, now, false) {
				events = append(events, pendingEvent{n, exhaustedEvent(g.pool.key, w.retries, msg, w.retryAt, m.failedRetryCeiling())})
			}
			return
		}
		w.retries++
		events = append(events, pendingEvent{n, retryingEvent(g.pool.key, w.retries, m.cfg.MaxRetries, msg, at)})
	})
	if exhausted {
		poolUpdates.WithLabelValues(resultFailure).Inc()
	}
	return events
}

// applyTerminal fails every participant until the backoff's ceiling. Call
// with m.mu held.
func (m *Manager) applyTerminal(g group, err error, now time.Time) []pendingEvent {
	var events []pendingEvent
	msg := armclient.Summary(err)
	m.eachPending(g, func(n *nodeState, w *work) {
		n.failed = &UpdateFailedError{Pool: g.pool.key, Err: err}
		if m.fail(n, w, now, true) {
			events = append(events, pendingEvent{n, failedEvent(g.pool.key, msg, w.retryAt)})
		}
	})
	return events
}

// failedRetryCeiling is the longest wait between the attempt series of a
// failed entry (at most --azure-admin-state-resync).
const failedRetryCeiling = time.Minute

func (m *Manager) failedRetryCeiling() time.Duration {
	if r := m.cfg.ResyncInterval; r > 0 && r < failedRetryCeiling {
		return r
	}
	return failedRetryCeiling
}

// fail ends an entry's attempt series as failed and sets when the next one
// starts: a terminal error waits the backoff's ceiling, exhausted retries
// twice the retry interval, doubled per failure before, up to that ceiling. It
// reports whether this is the first failure since the desired state
// changed, the only one with an event. Call with m.mu held.
func (m *Manager) fail(n *nodeState, w *work, now time.Time, terminal bool) bool {
	ceiling := m.failedRetryCeiling()
	wait := ceiling
	if !terminal {
		wait = 2 * m.cfg.RetryInterval
		for i := 0; i < w.failures && wait < ceiling; i++ {
			wait *= 2
		}
		wait = min(wait, ceiling)
	}
	w.pending, w.failed = false, true
	w.failures++
	w.retryAt = now.Add(wait)
	n.signal()
	return w.failures == 1
}

// retryFailed starts a new attempt series for every failed entry whose
// backoff has passed: an entry that failed is still wanted in its desired
// state, whatever the last write's outcome. Gone nodes have their own retry
// (reviewGone).
func (m *Manager) retryFailed() {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range m.nodes {
		if n.gone != nil || !n.known {
			continue
		}
		for _, w := range n.pools {
			if w.failed && !w.retryAt.IsZero() && !now.Before(w.retryAt) {
				w.again()
			}
		}
	}
}

// anyFailed reports whether the attempt series of some pool of the node
// failed. Call with m.mu held.
func (n *nodeState) anyFailed() bool {
	for _, w := range n.pools {
		if w.failed {
			return true
		}
	}
	return false
}

// nextWake is how long the loop may sleep: until the next resync or
// verification, the earliest parked pool, or the retry interval while work
// is pending.
func (m *Manager) nextWake() time.Duration {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	d := min(m.nextResync.Sub(now), m.gonePending(now), m.restoreWake(now))
	if _, next := m.verifyWanted(now); next > 0 {
		d = min(d, next)
	}
	if m.discoverErr != nil {
		d = min(d, m.cfg.RetryInterval)
	}
	for _, p := range m.pools {
		if len(p.reverted) == 0 {
			continue
		}
		if p.notBefore.After(now) {
			d = min(d, p.notBefore.Sub(now))
		} else {
			d = min(d, m.cfg.RetryInterval)
		}
	}
	for _, n := range m.nodes {
		if !n.known {
			d = min(d, m.cfg.RetryInterval)
			continue
		}
		for k, w := range n.pools {
			if w.failed && !w.retryAt.IsZero() && n.gone == nil {
				d = min(d, w.retryAt.Sub(now))
			}
			if !w.pending {
				continue
			}
			if p := m.pools[k]; p != nil && p.notBefore.After(now) {
				d = min(d, p.notBefore.Sub(now))
			} else {
				d = min(d, m.cfg.RetryInterval)
			}
		}
	}
	return max(d, minWake)
}
