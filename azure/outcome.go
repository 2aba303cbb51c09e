package azure

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
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

func (n *nodeState) anyFailed() bool {
	for _, w := range n.pools {
		if w.failed {
			return true
		}
	}
	return false
}

// updateConfirmed marks a node confirmed once no pool has work left, and
// returns the confirmation event when nodeguard changed its entries, but for
// a node being deleted: the termination controller says the cut in its one
// NodeReleased event (each event written is a write a fleet's deletion pays
// per node). Call with m.mu held.
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
	if n.nothingCut() {
		return []pendingEvent{{n, noBackendPoolEvent(m.cfg.ResourceGroup, m.unknown)}}
	}
	if !n.changed || (n.deleting && n.desired == AdminStateDown) {
		return nil
	}
	return []pendingEvent{{n, confirmedEvent(n.desired, len(n.pools))}}
}

// nothingCut reports whether the node is confirmed Down in no backend pool
// while nothing says it should be in none: nodeguard wrote none of its
// entries, no discovery found it in a pool (cloud-provider-azure removes a
// node being deleted or excluded: that is a harder cut), and it does not carry
// the exclusion label. A configuration that names the wrong resource group or
// load balancers looks like this. Call with m.mu held.
func (n *nodeState) nothingCut() bool {
	return n.desired == AdminStateDown && len(n.pools) == 0 && !n.changed && !n.member && !n.excluded
}

// emit records events, one per node, reason and pool per tick.
func (m *Manager) emit(ev *tickEvents, events []pendingEvent) {
	if m.recorder == nil {
		return
	}
	for _, e := range events {
		k := fmt.Sprintf("%s/%d/%s/%s", e.node.uid, e.node.gen, e.ev.reason, e.ev.pool)
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

// noteLeft notes that the node's entries left a pool while it was held
// Down. Call with m.mu held.
func (n *nodeState) noteLeft(pool string) {
	if n.left == nil {
		n.left = map[string]bool{}
	}
	n.left[pool] = true
}

// CutNote says, for the TrafficCut condition of a node whose Down is
// confirmed, how its traffic was cut when that was not AdminState Down
// alone: the backend pools its entries left (their owner, cloud-provider-azure,
// removes the entries of a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers, as Karpenter
// labels a node it drains). It is empty otherwise.
func (m *Manager) CutNote(uid types.UID) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.nodes[uid]
	if n == nil || n.gone != nil || n.desired != AdminStateDown || len(n.left) == 0 {
		return ""
	}
	pools := slices.Sorted(maps.Keys(n.left))
	return fmt.Sprintf("the node's entries left backend pool(s) %s: removed by their owner (cloud-provider-azure takes a node labelled %s, as Karpenter labels a node it drains, out of its load balancers), a harder cut than AdminState Down; nothing to restore there when the node comes back",
		strings.Join(pools, ", "), corev1.LabelNodeExcludeBalancers)
}
