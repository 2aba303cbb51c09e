package azure

import (
	"context"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// A restore is a state to hold, too. cloud-provider-azure PUTs whole
// IP-based pools without If-Match from the copy its reconcile read (its load
// balancer cache keeps one for up to 120 s): a copy read while a node was
// Down and written after nodeguard restored None puts the entry back Down,
// and the node, healthy, takes no new connections. So an entry nodeguard
// restores stays in its pool's record, marked with the restore time, for
// --azure-admin-state-restore-hold: the verification reads its pool as it
// reads those of the nodes held Down, and a Down found on it is set None
// again (a revert, as one of Down). The entry is held by its record alone
// (its entry name), so it needs no node state: the node may be forgotten
// (the taint watcher forgets it once None is confirmed) and nodeguard may
// restart in between. The hold ends at the window's end, when the node goes
// Down again (the entry is recorded Down), when the node is deleted or
// replaced (the entry is no longer its), or when it carries a taint on which
// cloud-provider-azure sets Down itself (that Down is no stale write).

// restoredAt is when a restored entry was restored (zero for an entry held
// Down or a time that does not parse, which ends its hold).
func (o owner) restoredAt() time.Time {
	t, err := ngv1alpha1.ParseTime(o.RestoredAt)
	if err != nil {
		return time.Time{}
	}
	return t
}

// holdsRestore reports whether a restored entry is still within its window.
func holdsRestore(o owner, now time.Time, hold time.Duration) bool {
	at := o.restoredAt()
	return o.restored() && !at.IsZero() && now.Before(at.Add(hold))
}

// holdsRestored reports whether any record holds an entry restored to None.
// Call with m.mu held.
func (m *Manager) holdsRestored() bool {
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() {
				return true
			}
		}
	}
	return false
}

// restoreTargetLocked lists, per pool, the restored entries a verification
// checks: within their window, of a node that is not Down again nor gone.
// Call with m.mu held.
func (m *Manager) restoreTargetLocked(now time.Time) map[string]poolRecord {
	out := map[string]poolRecord{}
	for key, rec := range m.recorded {
		for name, o := range rec {
			if !o.restored() || m.restoreEnded(o, now) {
				continue
			}
			if out[key] == nil {
				out[key] = poolRecord{}
			}
			out[key][name] = o
		}
	}
	return out
}

// restoreEnded reports whether a restored entry's node wants Down again (the
// writers record the entry Down) or its hold is over. Call with m.mu held.
func (m *Manager) restoreEnded(o owner, now time.Time) bool {
	n := m.nodes[o.UID]
	return m.holdOver(o, now) || n != nil && n.desired == AdminStateDown
}

// holdOver reports whether a restored entry's hold is over: past its window,
// or its node gone, replaced, or carrying a taint on which cloud-provider-azure
// sets Down itself (holdEnded). Call with m.mu held.
func (m *Manager) holdOver(o owner, now time.Time) bool {
	n := m.nodes[o.UID]
	return !holdsRestore(o, now, m.cfg.RestoreHold) || m.holdEnded[o.UID] || n != nil && n.gone != nil
}

// revertedRestores marks the restored entries of one listed pool that are
// Down: the pool's next attempt sets them None again. Call with m.mu held,
// after the check that nodeguard did not write the pool since the read.
func (m *Manager) revertedRestores(p listedPool, ps *poolState, target poolRecord, now time.Time) []pendingEvent {
	var events []pendingEvent
	for _, e := range p.pool.Properties.LoadBalancerBackendAddresses {
		name := entryName(e)
		o, held := target[name]
		if !held || !isDown(e.Properties.AdminState) || m.restoreEnded(o, now) {
			continue
		}
		if _, flagged := ps.reverted[name]; flagged {
			continue // already wanted
		}
		if ps.reverted == nil {
			ps.reverted = map[string]time.Time{}
		}
		ps.reverted[name] = now
		reverts.WithLabelValues(p.key, string(AdminStateNone)).Inc()
		events = append(events, pendingEvent{restoredNode(o), revertedRestoreEvent(p.key, name, o.restoredAt())})
	}
	return events
}

// restoredNode is what events about a restored entry are about: its node,
// which the manager may have forgotten.
func restoredNode(o owner) *nodeState { return &nodeState{uid: o.UID, name: o.Node} }

// restoresRepaired reports a pool attempt's restored entries set None again:
// those a verification found (flagged) get their open time observed; those
// the attempt found by itself (a write for other nodes) are counted and
// reported as reverts. Every flag the attempt saw is cleared: its fresh Get
// was the truth. Call with m.mu held.
func (m *Manager) restoresRepaired(key string, snap snapshot, res result, now time.Time) []pendingEvent {
	var events []pendingEvent
	for name, o := range res.restoredAgain {
		if since, flagged := snap.reverted[name]; flagged {
			revertOpen.WithLabelValues(key, string(AdminStateNone)).Observe(now.Sub(since).Seconds())
			continue
		}
		reverts.WithLabelValues(key, string(AdminStateNone)).Inc()
		events = append(events, pendingEvent{restoredNode(o), revertedRestoreEvent(key, name, o.restoredAt())})
	}
	m.clearReverted(key, snap)
	return events
}

// clearReverted drops the flags an attempt saw (one flagged again since
// stays). Call with m.mu held.
func (m *Manager) clearReverted(key string, snap snapshot) {
	p := m.pools[key]
	if p == nil {
		return
	}
	for name, since := range snap.reverted {
		if p.reverted[name].Equal(since) {
			delete(p.reverted, name)
		}
	}
}

// reviewRestored ends the holds that are over (holdOver; whether a node
// still exists is asked of the node cache at most every retry interval). It
// saves the records without them.
func (m *Manager) reviewRestored(ctx context.Context) {
	now := m.clock.Now()
	m.findRestoredGone(ctx, now)
	m.mu.Lock()
	var due []string
	for key, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() && m.holdOver(o, now) {
				due = append(due, key)
				break
			}
		}
	}
	m.mu.Unlock()
	for _, key := range due {
		if err := m.endRestores(ctx, key, now); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Dropping restored entries whose hold ended from the admin-state record failed; retrying", "pool", key)
		}
	}
	m.mu.Lock()
	for uid := range m.holdEnded {
		if !m.holdsRestoreOf(uid) {
			delete(m.holdEnded, uid)
		}
	}
	m.mu.Unlock()
}

// endRestores saves a pool's record without its restored entries whose hold
// ended. Like every record write, under the load balancer's lock.
func (m *Manager) endRestores(ctx context.Context, key string, now time.Time) error {
	lb, _, _ := strings.Cut(key, "/")
	lock := m.lbLock(lb)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	rec := maps.Clone(m.recorded[key])
	for name, o := range rec {
		if o.restored() && m.holdOver(o, now) {
			delete(rec, name)
		}
	}
	unchanged := len(rec) == len(m.recorded[key])
	m.mu.Unlock()
	if unchanged {
		return nil
	}
	return m.saveRecord(ctx, key, rec)
}

// holdsRestoreOf reports whether a restored entry is recorded for uid. Call
// with m.mu held.
func (m *Manager) holdsRestoreOf(uid types.UID) bool {
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() && o.UID == uid {
				return true
			}
		}
	}
	return false
}

// findRestoredGone asks the node cache whether the nodes of restored entries
// the manager does not track still exist: the taint watcher forgets a node
// once its None is confirmed, so a deletion in the window reaches the
// manager only here (or through Observe, when a node replaces it).
func (m *Manager) findRestoredGone(ctx context.Context, now time.Time) {
	if m.nodeReader == nil {
		return
	}
	m.mu.Lock()
	if now.Before(m.nextRestoreReview) {
		m.mu.Unlock()
		return
	}
	m.nextRestoreReview = now.Add(m.cfg.RetryInterval)
	untracked := map[types.UID]string{}
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() && m.nodes[o.UID] == nil && !m.holdEnded[o.UID] {
				untracked[o.UID] = o.Node
			}
		}
	}
	m.mu.Unlock()
	for uid, name := range untracked {
		var node corev1.Node
		err := m.nodeReader.Get(ctx, types.NamespacedName{Name: name}, &node)
		if err == nil && node.UID == uid || err != nil && !apierrors.IsNotFound(err) {
			continue
		}
		m.mu.Lock()
		m.holdEnded[uid] = true
		m.mu.Unlock()
	}
}

// restoreReplacedBy ends the holds of the restored entries of another node
// named name (a node of that name with another UID replaced it) and reports
// whether there was one. Call with m.mu held.
func (m *Manager) restoreReplacedBy(name string, by types.UID) bool {
	found := false
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() && o.Node == name && o.UID != by && !m.holdEnded[o.UID] {
				m.holdEnded[o.UID] = true
				found = true
			}
		}
	}
	return found
}

// endHoldOnCloudProviderSignal ends the holds of a node that carries a taint
// on which cloud-provider-azure sets Down itself (the out-of-service,
// shutdown and spot-eviction taints, whatever --signal-admin-state says):
// its Down then is no stale write, and nodeguard never restores None while
// such a taint is on. Call with m.mu held.
func (m *Manager) endHoldOnCloudProviderSignal(node *corev1.Node) {
	for _, t := range node.Spec.Taints {
		for _, cp := range ngv1alpha1.CloudProviderSignalTaints {
			if cp.Matches(t) && m.holdsRestoreOf(node.UID) {
				m.holdEnded[node.UID] = true
				return
			}
		}
	}
}

// restorePending reports whether a pool has restored entries to set None
// again. Call with m.mu held.
func (m *Manager) restorePending(key string) bool {
	p := m.pools[key]
	return p != nil && len(p.reverted) > 0
}

// restoreWake is how soon a restore hold needs the loop: at its window's
// end, at the next look in the node cache, or (a hold over whose record
// could not be saved yet) after the retry interval. Call with m.mu held.
func (m *Manager) restoreWake(now time.Time) time.Duration {
	d := maxWait
	for _, rec := range m.recorded {
		for _, o := range rec {
			if !o.restored() {
				continue
			}
			if m.holdOver(o, now) {
				d = min(d, m.cfg.RetryInterval)
				continue
			}
			d = min(d, o.restoredAt().Add(m.cfg.RestoreHold).Sub(now))
			if m.nodeReader != nil && m.nodes[o.UID] == nil {
				d = min(d, m.nextRestoreReview.Sub(now))
			}
		}
	}
	return d
}
