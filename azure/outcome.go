package azure

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

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
	case res.err == nil && res.recordErr != nil:
		// The write carried restores, not the Downs whose record could not
		// be saved: those are retried as the failed save would have been.
		events = m.applySuccess(g, snap, res, now)
		if p != nil {
			p.notBefore = now.Add(m.cfg.RetryInterval)
		}
		held := group{pool: g.pool, participants: map[types.UID]uint64{}}
		for uid, gen := range g.participants {
			if res.held[string(uid)] {
				held.participants[uid] = gen
			}
		}
		events = append(events, m.applyRetriable(held, res.recordErr, now, now.Add(m.cfg.RetryInterval))...)
	case res.err == nil:
		events = m.applySuccess(g, snap, res, now)
	case class == classShutdown:
		// Abandoned because we are stopping: nothing to report.
	case class == classStale:
		delete(m.pools, g.pool.key)
		for _, n := range m.nodes {
			delete(n.pools, g.pool.key)
			events = append(events, m.updateConfirmed(n)...)
		}
	case class == classBusy:
		at := now.Add(m.cfg.RetryInterval)
		if retryAfter.After(now) {
			at = retryAfter
		}
		if p != nil {
			p.notBefore = at
		}
		events = m.applyBusy(g, res.err, at)
	case class == classReread:
		if p != nil {
			p.conflicts++
			p.notBefore = now.Add(conflictDelay(p.conflicts, m.cfg.RetryInterval))
		}
	case class == classThrottled, class == classRetriable:
		at := now.Add(m.cfg.RetryInterval)
		if class == classThrottled && retryAfter.After(now) {
			at = retryAfter
		}
		if p != nil {
			p.notBefore = at
		}
		events = m.applyRetriable(g, res.err, now, at)
	default:
		poolUpdates.WithLabelValues(resultFailure).Inc()
		events = m.applyTerminal(g, res.err, now)
		// A terminal error parks nothing: restored entries to set None
		// again wait for the next verification to find them, not a spin.
		m.clearReverted(g.pool.key, snap)
	}
	m.mu.Unlock()
	if res.err != nil && class != classShutdown && class != classStale {
		ctrl.LoggerFrom(ctx).V(1).Info("Backend pool update failed", "pool", g.pool.key, "error", armclient.Summary(res.err))
	}
	m.emit(ev, events)
}

// applySuccess confirms the pool for every node whose desired state is still
// the one applied. Call with m.mu held.
func (m *Manager) applySuccess(g group, snap snapshot, res result, now time.Time) []pendingEvent {
	if res.wrote {
		poolUpdates.WithLabelValues(resultSuccess).Inc()
	}
	if p := m.pools[g.pool.key]; p != nil {
		p.notBefore, p.conflicts = time.Time{}, 0
		if res.wrote {
			p.writes++
		}
	}
	events := m.restoresRepaired(g.pool.key, snap, res, now)
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
		if res.held[k] {
			continue // its Down waits for the record (apply)
		}
		if n.gone != nil {
			// Its recorded entries in the pool were restored (or had gone).
			*w = work{}
			events = append(events, m.finishGone(n)...)
			continue
		}
		switch {
		case !res.matched[k] && !res.noEntry[k]:
			// Not a member of this pool after all: of an excluded node,
			// cloud-provider-azure removed the entries (counted as cut).
			if n.excluded && n.desired == AdminStateDown {
				n.noteLeft(g.pool.key)
			}
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
			if !w.openSince.IsZero() && n.desired == AdminStateDown {
				revertOpen.WithLabelValues(g.pool.key, string(AdminStateDown)).Observe(now.Sub(w.openSince).Seconds())
			}
			if _, wanted := g.participants[uid]; !wanted && !w.pending && !w.failed && res.changed[k] && n.desired == AdminStateDown {
				// Held Down and done, yet this write (for other nodes) had to
				// set it Down again: another writer reverted it since.
				reverts.WithLabelValues(g.pool.key, string(AdminStateDown)).Inc()
				events = append(events, pendingEvent{n, revertedEvent(g.pool.key, n.name)})
			}
			*w = work{}
		}
		if res.left[k] && n.desired == AdminStateDown {
			n.noteLeft(g.pool.key)
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

// applyBusy reports, once per attempt series, that another operation is
// updating the load balancer. It spends no retry: the work stays pending and
// is tried again at the answer's Retry-After. Call with m.mu held.
func (m *Manager) applyBusy(g group, err error, at time.Time) []pendingEvent {
	var events []pendingEvent
	msg := armclient.Summary(err)
	m.eachPending(g, func(n *nodeState, w *work) {
		if !w.busyReported {
			w.busyReported = true
			events = append(events, pendingEvent{n, busyEvent(g.pool.key, msg, at)})
		}
	})
	return events
}

// eachPending calls f for every participant of an attempt whose desired
// state is still the one attempted and whose work in the pool is pending
// (one forgotten or changed meanwhile is dropped quietly). Call with m.mu
// held.
func (m *Manager) eachPending(g group, f func(n *nodeState, w *work)) {
	for uid, gen := range g.participants {
		n := m.nodes[uid]
		if n == nil || n.gen != gen {
			continue
		}
		if w := n.pools[g.pool.key]; w != nil && w.pending {
			f(n, w)
		}
	}
}
