package azure

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

type pendingEvent struct {
	node *nodeState
	ev   event
}

// apply records a pool attempt's outcome.
func (m *Manager) apply(ctx context.Context, g group, snap snapshot, res result, ev *tickEvents) {
	class, retryAfter := classTerminal, time.Time{}
	if res.err != nil {
		class, retryAfter = classify(ctx, res.err)
	}
	now := m.clock.Now()
	var events []pendingEvent
	m.mu.Lock()
	p := m.pools[g.pool.key]
	switch {
	case res.err == nil:
		events = m.applySuccess(g, snap, res)
	case class == classShutdown:
		// Abandoned because we are stopping: nothing to report.
	case class == classStale:
		delete(m.pools, g.pool.key)
		for _, n := range m.nodes {
			delete(n.pools, g.pool.key)
			events = append(events, m.updateConfirmed(n)...)
		}
	case class == classThrottled, class == classRetriable:
		at := now.Add(m.cfg.RetryInterval)
		if class == classThrottled && retryAfter.After(now) {
			at = retryAfter
		}
		if p != nil {
			p.notBefore = at
		}
		events = m.applyRetriable(g, res.err, at)
	default:
		poolUpdates.WithLabelValues(resultFailure).Inc()
		events = m.applyTerminal(g, res.err)
	}
	m.mu.Unlock()
	if res.err != nil && class != classShutdown && class != classStale {
		ctrl.LoggerFrom(ctx).V(1).Info("Backend pool update failed", "pool", g.pool.key, "error", armclient.Summary(res.err))
	}
	m.emit(ev, events)
}

// applySuccess confirms the pool for every node whose desired state is still
// the one applied. Call with m.mu held.
func (m *Manager) applySuccess(g group, snap snapshot, res result) []pendingEvent {
	if res.wrote {
		poolUpdates.WithLabelValues(resultSuccess).Inc()
	}
	if p := m.pools[g.pool.key]; p != nil {
		p.notBefore = time.Time{}
		if res.wrote {
			p.writes++
		}
	}
	var events []pendingEvent
	for uid, n := range m.nodes {
		k := string(uid)
		w := n.pools[g.pool.key]
		if w == nil {
			if res.matched[k] && n.known && m.pools[g.pool.key] != nil {
				// A member discovery had not seen yet: now confirmed.
				n.pools[g.pool.key] = &work{}
			}
			continue
		}
		if gen, ok := snap.gens[uid]; !ok || gen != n.gen {
			continue // desired state changed meanwhile: stays pending
		}
		if n.gone != nil {
			// Its recorded entries in the pool were restored (or had gone).
			*w = work{}
			events = append(events, m.finishGone(n)...)
			continue
		}
		switch {
		case !res.matched[k] && !res.noEntry[k]:
			// Not a member of this pool after all.
			delete(n.pools, g.pool.key)
		case !res.matched[k] && n.desired == AdminStateDown:
			// A member with no entry: nothing can carry Down, so Down is
			// reported as not applied, never as confirmed.
			*w = work{failed: true}
			n.failed = &UpdateFailedError{Pool: g.pool.key, Err: &NoEntryError{Pool: g.pool.key}}
			n.signal()
			if !n.warned[g.pool.key] {
				n.warned[g.pool.key] = true
				noEntryDown.WithLabelValues(g.pool.key).Inc()
				events = append(events, pendingEvent{n, noEntryEvent(g.pool.key)})
			}
			continue
		default:
			// Entries match the desired state, or (None) there is no entry
			// that could be Down.
			*w = work{}
		}
		if res.changed[k] {
			n.changed = true
		}
		if n.failed != nil && !n.anyFailed() {
			n.failed = nil
		}
		events = append(events, m.updateConfirmed(n)...)
	}
	return events
}

// applyRetriable spends one retry of every participant; those out of
// retries fail. Call with m.mu held.
func (m *Manager) applyRetriable(g group, err error, at time.Time) []pendingEvent {
	var events []pendingEvent
	exhausted := false
	msg := armclient.Summary(err)
	for uid, gen := range g.participants {
		n := m.nodes[uid]
		if n == nil || n.gen != gen {
			continue // forgotten or changed: dropped quietly
		}
		w := n.pools[g.pool.key]
		if w == nil || !w.pending {
			continue
		}
		if w.retries >= m.cfg.MaxRetries {
			exhausted = true
			w.pending, w.failed = false, true
			n.failed = &UpdateFailedError{Pool: g.pool.key, Retries: w.retries, Err: err}
			n.signal()
			events = append(events, pendingEvent{n, exhaustedEvent(g.pool.key, w.retries, msg, m.cfg.ResyncInterval)})
			continue
		}
		w.retries++
		events = append(events, pendingEvent{n, retryingEvent(g.pool.key, w.retries, m.cfg.MaxRetries, msg, at)})
	}
	if exhausted {
		poolUpdates.WithLabelValues(resultFailure).Inc()
	}
	return events
}

// applyTerminal fails every participant. Call with m.mu held.
func (m *Manager) applyTerminal(g group, err error) []pendingEvent {
	var events []pendingEvent
	msg := armclient.Summary(err)
	for uid, gen := range g.participants {
		n := m.nodes[uid]
		if n == nil || n.gen != gen {
			continue
		}
		w := n.pools[g.pool.key]
		if w == nil || !w.pending {
			continue
		}
		w.pending, w.failed = false, true
		n.failed = &UpdateFailedError{Pool: g.pool.key, Err: err}
		n.signal()
		events = append(events, pendingEvent{n, failedEvent(g.pool.key, msg)})
	}
	return events
}

func (n *nodeState) anyFailed() bool {
	for _, w := range n.pools {
		if w.failed {
			return true
		}
	}
	return false
}

// updateConfirmed marks a node confirmed once no pool has work left, and
// returns the confirmation event when nodeguard changed its entries. Call
// with m.mu held.
func (m *Manager) updateConfirmed(n *nodeState) []pendingEvent {
	if n.confirmed || !n.known || n.gone != nil {
		return nil
	}
	if n.hasPendingWork() {
		return nil
	}
	if n.anyFailed() {
		n.signal() // settled, some pool failed: WaitConfirmed reports it
		return nil
	}
	n.confirmed = true
	n.failed = nil
	n.signal()
	confirmDuration.WithLabelValues(string(n.desired)).Observe(m.clock.Since(n.since).Seconds())
	if !n.changed {
		return nil
	}
	return []pendingEvent{{n, confirmedEvent(n.desired, len(n.pools))}}
}

// emit records events, one per node and reason per tick.
func (m *Manager) emit(ev *tickEvents, events []pendingEvent) {
	if m.recorder == nil {
		return
	}
	for _, e := range events {
		k := fmt.Sprintf("%s/%d/%s", e.node.uid, e.node.gen, e.ev.reason)
		ev.mu.Lock()
		dup := ev.seen[k]
		ev.seen[k] = true
		ev.mu.Unlock()
		if dup {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.ev.warning {
			typ = corev1.EventTypeWarning
		}
		m.recorder.Eventf(regarding(e.node), nil, typ, e.ev.reason, eventAction, "%s", e.ev.note)
	}
}

// nextWake is how long the loop may sleep: until the next resync or
// verification, the earliest parked pool, or the retry interval while work
// is pending.
func (m *Manager) nextWake() time.Duration {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	d := min(m.nextResync.Sub(now), m.gonePending(now))
	if _, next := m.verifyWanted(now); next > 0 {
		d = min(d, next)
	}
	if m.discoverErr != nil {
		d = min(d, m.cfg.RetryInterval)
	}
	for _, n := range m.nodes {
		if !n.known {
			d = min(d, m.cfg.RetryInterval)
			continue
		}
		for k, w := range n.pools {
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
