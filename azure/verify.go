package azure

import (
	"context"
	"maps"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure/backends"
)

// Verification: another writer of the pools (cloud-provider-azure PUTs a
// whole pool as it read it, without If-Match) can put a leaving node's
// entries back to None, or add one at None, and put an entry nodeguard
// restored back to Down. While any node is held Down, or a restored entry
// held None (restore.go), the manager re-reads the load balancers every
// --azure-admin-state-verify-interval and soon after the cluster changes in a
// way that makes cloud-provider-azure write, and gives every such entry
// pending work: the writers set it again with a fresh Get and If-Match, as
// any other change.
const (
	// verifyAfterChange is how long after a node or LoadBalancer Service
	// change the next verification runs: cloud-provider-azure writes within
	// its reconcile of that change.
	verifyAfterChange = 2 * time.Second
	// minVerifyGap bounds the read rate whatever changes: verifications are
	// at least this far apart.
	minVerifyGap = time.Second
)

// ClusterChanged says that the cluster's node set or a LoadBalancer Service
// changed, which is when cloud-provider-azure rewrites backend pools: the
// next verification runs soon (verifyAfterChange), if any node is held Down.
func (m *Manager) ClusterChanged() {
	if m.cfg.VerifyInterval <= 0 {
		return
	}
	m.mu.Lock()
	at := m.clock.Now().Add(verifyAfterChange)
	if gap := m.lastVerify.Add(minVerifyGap); gap.After(at) {
		at = gap
	}
	if m.nextVerify.IsZero() || at.Before(m.nextVerify) {
		m.nextVerify = at
	}
	m.mu.Unlock()
	m.wake()
}

// verifyWanted reports whether a verification is due now, and when the next
// one is when it is not. Call with m.mu held.
func (m *Manager) verifyWanted(now time.Time) (due bool, next time.Duration) {
	if m.cfg.VerifyInterval <= 0 || !m.discovered || (!m.holdsDown() && !m.holdsRestored()) {
		m.nextVerify = time.Time{}
		return false, maxWait
	}
	if m.nextVerify.IsZero() {
		// First hold since the last verification: its own write is the
		// first read; verify one interval later.
		m.nextVerify = now.Add(m.verifyInterval())
	}
	if now.Before(m.nextVerify) {
		return false, m.nextVerify.Sub(now)
	}
	return true, 0
}

// Verifying reports whether the manager verifies the entries it holds Down
// (--azure-admin-state-verify-interval above 0): only then do cluster changes
// concern it.
func (m *Manager) Verifying() bool { return m.cfg.VerifyInterval > 0 }

func (m *Manager) verifyInterval() time.Duration { return max(m.cfg.VerifyInterval, minVerifyGap) }

// maxWait stands for "no deadline" in nextWake's minimum.
const maxWait = time.Duration(1<<63 - 1)

// holdsDown reports whether any live node's desired state is Down. Call with
// m.mu held.
func (m *Manager) holdsDown() bool {
	for _, n := range m.nodes {
		if n.gone == nil && n.desired == AdminStateDown {
			return true
		}
	}
	return false
}

// verifyTarget is what a verification compares the listed pools with: the
// nodes held Down, the restored entries held None (by pool), and each pool's
// write count when the read started.
type verifyTarget struct {
	index    *backends.Index
	gens     map[types.UID]uint64
	restored map[string]poolRecord
	writes   map[string]uint64
}

// verifyReadTimeout bounds a verification's read, so that a throttled ARM
// read delays the loop's next round by at most this much.
const verifyReadTimeout = 15 * time.Second

// verify re-reads the managed load balancers when due and gives pending work
// to every entry of a node held Down that is not Down, and to every restored
// entry held None that is Down, with a Warning event and a count per pool. It
// reports whether it read.
func (m *Manager) verify(ctx context.Context, ev *tickEvents) bool {
	now := m.clock.Now()
	m.mu.Lock()
	due, _ := m.verifyWanted(now)
	if !due {
		m.mu.Unlock()
		return false
	}
	m.lastVerify, m.nextVerify = now, now.Add(m.verifyInterval())
	target := m.verifyTargetLocked()
	target.restored = m.restoreTargetLocked(now)
	m.mu.Unlock()
	readCtx, cancel := context.WithTimeout(ctx, verifyReadTimeout)
	defer cancel()
	pools, err := m.listPools(readCtx)
	if err != nil {
		if ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "Verifying the admin state of held-down entries failed; trying again at the next verification")
		}
		return true
	}
	var events []pendingEvent
	left := map[string][]string{}
	for _, p := range pools {
		keys, err := target.index.Match(ctx, p.pool, m.nics)
		if err != nil {
			ctrl.LoggerFrom(ctx).V(1).Info("Matching nodes to a backend pool for verification failed", "pool", p.key, "error", err.Error())
			continue
		}
		evs, gone := m.reverted(p, keys, target)
		events = append(events, evs...)
		if len(gone) > 0 {
			left[p.key] = gone
		}
	}
	m.emit(ev, events)
	for key, names := range left {
		if err := m.dropLeftRestores(ctx, key, names, target.writes[key]); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Dropping restored entries that left their pool from the admin-state record failed; the next attempt at the pool drops them", "pool", key)
		}
	}
	return true
}

// verifyTargetLocked snapshots the nodes held Down. Call with m.mu held.
func (m *Manager) verifyTargetLocked() verifyTarget {
	t := verifyTarget{gens: map[types.UID]uint64{}, writes: map[string]uint64{}}
	var idents []backends.Node
	for uid, n := range m.nodes {
		if n.gone == nil && n.known && n.desired == AdminStateDown {
			idents = append(idents, n.ident)
			t.gens[uid] = n.gen
		}
	}
	for k, p := range m.pools {
		t.writes[k] = p.writes
	}
	t.index = backends.NewIndex(idents)
	return t
}

// reverted marks the entries of one listed pool that belong to a node held
// Down and are not Down, and the restored entries held None that are Down.
// An entry nodeguard is writing, or wrote since the read began, is left to
// that write. It also returns the restored entries that left the pool (their
// owner removed them: cloud-provider-azure, from a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers), and notes the
// nodes held Down whose recorded entries left it (entriesLeft).
func (m *Manager) reverted(p listedPool, keys []string, target verifyTarget) ([]pendingEvent, []string) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := m.pools[p.key]
	if ps == nil || ps.writes != target.writes[p.key] {
		return nil, nil
	}
	gone := m.entriesLeft(p)
	events := m.revertedRestores(p, ps, target.restored[p.key], now)
	seen := map[types.UID]bool{}
	for i, k := range keys {
		uid := types.UID(k)
		e := p.pool.Properties.LoadBalancerBackendAddresses[i]
		if k == "" || seen[uid] || e == nil || e.Properties == nil || isDown(e.Properties.AdminState) {
			continue
		}
		n := m.nodes[uid]
		if n == nil || n.gone != nil || n.desired != AdminStateDown || n.gen != target.gens[uid] {
			continue
		}
		w := n.pools[p.key]
		if w != nil && (w.pending || w.failed) {
			// Being written, or failed and waiting for its backoff
			// (retryFailed): either way already wanted.
			continue
		}
		seen[uid] = true
		if w == nil {
			w = &work{}
			n.pools[p.key] = w
		}
		w.again()
		w.openSince = now
		n.confirmed = false // not cut until the rewrite lands: a drain starting now waits for it
		reverts.WithLabelValues(p.key, string(AdminStateDown)).Inc()
		events = append(events, pendingEvent{n, revertedEvent(p.key, entryName(e))})
	}
	return events, gone
}

// entriesLeft looks for the pool's recorded entries that are not in the
// listed pool: their owner removed them. A node held Down counts them as cut
// (noted for CutNote); restored entries are returned, to leave the record:
// one that comes back is a new entry, no longer held. Entries recorded Down
// leave the record at the pool's next attempt (planPool), which reads the
// pool fresh. Call with m.mu held.
func (m *Manager) entriesLeft(p listedPool) []string {
	rec := m.recorded[p.key]
	if len(rec) == 0 || p.pool == nil || p.pool.Properties == nil {
		return nil
	}
	present := make(map[string]bool, len(p.pool.Properties.LoadBalancerBackendAddresses))
	for _, e := range p.pool.Properties.LoadBalancerBackendAddresses {
		if name := entryName(e); name != "" {
			present[name] = true
		}
	}
	var gone []string
	for name, o := range rec {
		if present[name] {
			continue
		}
		if o.restored() {
			gone = append(gone, name)
			continue
		}
		if n := m.nodes[o.UID]; n != nil && n.gone == nil && n.desired == AdminStateDown {
			n.noteLeft(p.key)
		}
	}
	return gone
}

// dropLeftRestores saves a pool's record without the restored entries that
// left the pool, unless nodeguard wrote the pool since it was read. Like
// every record write, under the load balancer's lock.
func (m *Manager) dropLeftRestores(ctx context.Context, key string, names []string, writes uint64) error {
	lb, _, _ := strings.Cut(key, "/")
	lock := m.lbLock(lb)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	ps := m.pools[key]
	if ps == nil || ps.writes != writes {
		m.mu.Unlock()
		return nil
	}
	rec := maps.Clone(m.recorded[key])
	dropped := 0
	for _, name := range names {
		if o, ok := rec[name]; ok && o.restored() {
			delete(rec, name)
			dropped++
		}
	}
	m.mu.Unlock()
	if dropped == 0 {
		return nil
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Restored entries left their backend pool: no longer held", "pool", key, "entries", dropped)
	return m.saveRecord(ctx, key, rec)
}
