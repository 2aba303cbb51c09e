package azure

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Why a gone node's recorded entries are restored.
const (
	dueReplaced = "replaced"
	dueGone     = "gone"
)

// goneState is what the manager knows of a node that no longer exists but
// still has entries recorded Down.
type goneState struct {
	since time.Time
	// due is why its entries are restored now ("" while it waits).
	due string
	// replacement is the node of the same name that replaced it, if any.
	replacement types.UID
}

// loadRecords reads the records once, before any writer runs: a writer that
// did not know them could restore a Down someone else set, or record over
// them.
func (m *Manager) loadRecords(ctx context.Context) error {
	m.mu.Lock()
	loaded := m.recorded != nil
	m.mu.Unlock()
	if loaded {
		return nil
	}
	recs, unreadable, ignored, err := m.records.Load(ctx)
	if err != nil {
		return err
	}
	m.reportUnreadable(ctx, unreadable)
	m.reportIgnored(ctx, ignored)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recorded = recs
	for pool, rec := range recs {
		setRecordBytes(pool, rec)
		for _, o := range rec {
			if since, err := ngv1alpha1.ParseTime(o.GoneSince); err == nil && !o.restored() && m.nodes[o.UID] == nil {
				m.markGone(o.UID, o.Node, since)
			}
		}
	}
	m.updateRecordGauge()
	return nil
}

// reportUnreadable reports the records Load skipped, with a Warning event on
// each Lease: the entries they name are not restored by nodeguard.
func (m *Manager) reportUnreadable(ctx context.Context, unreadable []UnreadableRecord) {
	for _, u := range unreadable {
		unreadableRecords.Inc()
		ctrl.LoggerFrom(ctx).Error(u, "Skipping an unreadable admin-state record", "lease", klog.KObj(u.Lease))
		if m.recorder != nil {
			lease := u.Lease.DeepCopy()
			lease.SetGroupVersionKind(coordinationv1.SchemeGroupVersion.WithKind("Lease"))
			m.recorder.Eventf(lease, nil, corev1.EventTypeWarning, ReasonRecordUnreadable, eventAction, "%s", unreadableEvent(u).note)
		}
	}
}

// reportIgnored reports the record Leases Load ignored because they are not
// nodeguard's, with a Warning event on each (once: records are read once).
func (m *Manager) reportIgnored(ctx context.Context, ignored []IgnoredRecord) {
	for _, r := range ignored {
		ignoredRecords.Inc()
		ctrl.LoggerFrom(ctx).Info("Ignoring a Lease that claims to be an admin-state record", "lease", klog.KObj(r.Lease), "pool", r.Pool, "reason", r.Error())
		if m.recorder != nil {
			lease := r.Lease.DeepCopy()
			lease.SetGroupVersionKind(coordinationv1.SchemeGroupVersion.WithKind("Lease"))
			m.recorder.Eventf(lease, nil, corev1.EventTypeWarning, ReasonRecordIgnored, eventAction, "%s", ignoredRecordEvent(r).note)
		}
	}
}

// saveRecord stores a pool's record and mirrors it. Call with the pool's
// load-balancer lock held (one writer per record).
func (m *Manager) saveRecord(ctx context.Context, pool string, rec poolRecord) error {
	if err := m.records.Save(ctx, pool, rec); err != nil {
		recordWrites.WithLabelValues(resultFailure).Inc()
		return &RecordError{Pool: pool, Err: err}
	}
	recordWrites.WithLabelValues(resultSuccess).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(rec) == 0 {
		delete(m.recorded, pool)
	} else {
		m.recorded[pool] = maps.Clone(rec)
	}
	m.updateRecordGauge()
	setRecordBytes(pool, rec)
	return nil
}

// setRecordBytes sets a pool's record size gauge.
func setRecordBytes(pool string, rec poolRecord) {
	if len(rec) == 0 {
		recordBytes.DeleteLabelValues(pool)
		return
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	recordBytes.WithLabelValues(pool).Set(float64(len(data)))
}

// ownsEntries reports whether any entry is recorded Down for uid (a restored
// one is held None, not owed a restore). Call with m.mu held.
func (m *Manager) ownsEntries(uid types.UID) bool {
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.UID == uid && !o.restored() {
				return true
			}
		}
	}
	return false
}

// markGone tracks a node that is gone with entries recorded Down. Its work
// waits until it is due. Call with m.mu held.
func (m *Manager) markGone(uid types.UID, name string, since time.Time) {
	if n := m.nodes[uid]; n != nil && n.gone != nil {
		return
	}
	m.nodes[uid] = &nodeState{
		uid: uid, name: name, desired: AdminStateNone, known: true, since: since,
		pools: map[string]*work{}, notify: make(chan struct{}), warned: map[string]bool{},
		gone: &goneState{since: since},
	}
}

// Observe tells the manager that a node exists, whatever its admin state
// and whatever happened to its name before: a gone node of the same name
// with another UID (a reimaged VMSS instance, a re-created node) is replaced,
// and the entries recorded Down for it are restored now, not after
// --azure-admin-state-gone-node-grace. The taint watcher calls it for every
// node it sees. A node with a taint cloud-provider-azure sets Down on ends
// the hold of its restored entries (restore.go).
func (m *Manager) Observe(node *corev1.Node) {
	if node == nil {
		return
	}
	m.mu.Lock()
	due := m.replacedBy(node.Name, node.UID)
	m.endHoldOnCloudProviderSignal(node)
	m.mu.Unlock()
	if due {
		m.wake()
	}
}

// replacedBy makes due, at once, the gone nodes that the node name/uid
// replaces (same name, another UID), ends the holds of the entries restored
// for them, and reports whether there was one. Call with m.mu held.
func (m *Manager) replacedBy(name string, by types.UID) bool {
	found := m.restoreReplacedBy(name, by)
	for uid, n := range m.nodes {
		if n.gone != nil && n.gone.due == "" && n.name == name && uid != by {
			n.gone.replacement = by
			m.makeDue(n, dueReplaced)
			found = true
		}
	}
	return found
}

// findReplacements asks the node cache, for every gone node still in its
// grace period, whether a node of its name exists again: a replacement seen
// before the gone node was known (before a restart read the records, or
// before the old node's deletion was observed) is caught here.
func (m *Manager) findReplacements(ctx context.Context) {
	if m.nodeReader == nil {
		return
	}
	m.mu.Lock()
	waiting := map[types.UID]string{}
	for uid, n := range m.nodes {
		if n.gone != nil && n.gone.due == "" {
			waiting[uid] = n.name
		}
	}
	m.mu.Unlock()
	for uid, name := range waiting {
		var node corev1.Node
		if err := m.nodeReader.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil || node.UID == uid {
			continue // not there (yet), or unreadable: the grace period still ends it
		}
		m.Observe(&node)
	}
}

// makeDue gives a gone node work in every pool where entries are recorded
// Down for it. Call with m.mu held.
func (m *Manager) makeDue(n *nodeState, why string) {
	n.gone.due = why
	n.gen++
	for pool, rec := range m.recorded {
		if m.pools[pool] == nil {
			continue // not listed (yet): dropVanishedRecords drops it if it is gone
		}
		for _, o := range rec {
			if o.UID == n.uid && !o.restored() {
				n.pools[pool] = &work{pending: true}
				break
			}
		}
	}
}

// reviewGone finds the nodes with recorded entries that no longer exist,
// records since when, and makes due those replaced by a node of the same
// name or gone for the grace period. It lists nodes (from the cache) at
// most every retry interval, and only while records name a node the
// manager does not track.
func (m *Manager) reviewGone(ctx context.Context) {
	now := m.clock.Now()
	m.mu.Lock()
	untracked := m.untrackedOwners()
	check := m.nodeReader != nil && len(untracked) > 0 && !now.Before(m.nextReview)
	m.mu.Unlock()
	if check {
		if err := m.findGone(ctx, untracked, now); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing nodes to find gone ones failed; retrying")
		}
	}
	m.findReplacements(ctx)
	if err := m.recordGoneSince(ctx); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Recording since when nodes are gone failed; retrying")
	}
	m.mu.Lock()
	for _, n := range m.nodes {
		switch {
		case n.gone == nil:
		case n.gone.due == "" && !now.Before(n.gone.since.Add(m.cfg.GoneNodeGrace)):
			m.makeDue(n, dueGone)
		case n.gone.due != "" && !n.hasPendingWork() && m.ownsEntries(n.uid):
			// An attempt failed, or its record could not be saved: again.
			m.makeDue(n, n.gone.due)
		}
	}
	m.mu.Unlock()
}

func (n *nodeState) hasPendingWork() bool {
	for _, w := range n.pools {
		if w.pending {
			return true
		}
	}
	return false
}

// untrackedOwners returns the recorded owners the manager does not track
// (by UID, with their node name). Call with m.mu held.
func (m *Manager) untrackedOwners() map[types.UID]string {
	out := map[types.UID]string{}
	for _, rec := range m.recorded {
		for _, o := range rec {
			if m.nodes[o.UID] == nil && !o.restored() {
				out[o.UID] = o.Node
			}
		}
	}
	return out
}

// findGone lists the nodes and marks gone every untracked owner whose node
// does not exist, writing since when into its records.
func (m *Manager) findGone(ctx context.Context, untracked map[types.UID]string, now time.Time) error {
	var list corev1.NodeList
	if err := m.nodeReader.List(ctx, &list); err != nil {
		return err
	}
	live := make(map[types.UID]bool, len(list.Items))
	byName := make(map[string]types.UID, len(list.Items))
	for _, n := range list.Items {
		live[n.UID] = true
		byName[n.Name] = n.UID
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextReview = now.Add(m.cfg.RetryInterval)
	for uid, name := range untracked {
		if live[uid] || m.nodes[uid] != nil {
			continue
		}
		m.markGone(uid, name, now)
		if other, ok := byName[name]; ok {
			n := m.nodes[uid]
			n.gone.replacement = other
			m.makeDue(n, dueReplaced)
		}
	}
	return nil
}

// recordGoneSince writes into the records since when their gone nodes are
// gone, so that the grace period survives a restart.
func (m *Manager) recordGoneSince(ctx context.Context) error {
	for _, key := range m.poolsMissingGoneSince() {
		if err := m.stampGoneSince(ctx, key); err != nil {
			return err
		}
	}
	return nil
}

// poolsMissingGoneSince lists the pools whose record names a gone node
// without since when.
func (m *Manager) poolsMissingGoneSince() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for key, rec := range m.recorded {
		for _, o := range rec {
			if n := m.nodes[o.UID]; n != nil && n.gone != nil && o.GoneSince == "" && !o.restored() {
				out = append(out, key)
				break
			}
		}
	}
	return out
}

func (m *Manager) stampGoneSince(ctx context.Context, key string) error {
	lb, _, _ := strings.Cut(key, "/")
	lock := m.lbLock(lb)
	lock.Lock()
	defer lock.Unlock()
	m.mu.Lock()
	rec := maps.Clone(m.recorded[key])
	for name, o := range rec {
		if n := m.nodes[o.UID]; n != nil && n.gone != nil && o.GoneSince == "" && !o.restored() {
			o.GoneSince = ngv1alpha1.FormatTime(n.gone.since)
			rec[name] = o
		}
	}
	m.mu.Unlock()
	return m.saveRecord(ctx, key, rec)
}

// finishGone drops a due gone node once nothing is recorded for it any more,
// and reports the restoration. Call with m.mu held.
func (m *Manager) finishGone(n *nodeState) []pendingEvent {
	if n.gone == nil || n.gone.due == "" || m.ownsEntries(n.uid) {
		return nil
	}
	for _, w := range n.pools {
		if w.pending || w.failed {
			return nil
		}
	}
	delete(m.nodes, n.uid)
	n.signal()
	goneRestored.WithLabelValues(n.gone.due).Inc()
	about := n
	if n.gone.replacement != "" {
		about = &nodeState{uid: n.gone.replacement, name: n.name}
	}
	return []pendingEvent{{about, goneRestoredEvent(n)}}
}

// updateRecordGauge counts the entries recorded Down, and those restored and
// held None. Call with m.mu held.
func (m *Manager) updateRecordGauge() {
	down, restored := 0, 0
	for _, rec := range m.recorded {
		for _, o := range rec {
			if o.restored() {
				restored++
			} else {
				down++
			}
		}
	}
	recordedEntries.Set(float64(down))
	restoredEntries.Set(float64(restored))
}

// dropVanishedRecords forgets the records of pools the listing no longer
// shows: their entries went with them.
func (m *Manager) dropVanishedRecords(ctx context.Context, present map[string]bool) {
	m.mu.Lock()
	var vanished []string
	for key := range m.recorded {
		if !present[key] {
			vanished = append(vanished, key)
		}
	}
	m.mu.Unlock()
	for _, key := range vanished {
		if err := m.saveRecord(ctx, key, nil); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Dropping the admin-state record of a vanished pool failed", "pool", key)
		}
	}
}

// gonePending reports how soon a gone node needs a look: at the end of its
// grace period, or at the next review while records name untracked nodes.
// Call with m.mu held.
func (m *Manager) gonePending(now time.Time) time.Duration {
	d := time.Duration(1<<63 - 1)
	if m.recorded == nil {
		return m.cfg.RetryInterval
	}
	for _, n := range m.nodes {
		if n.gone != nil && n.gone.due == "" {
			d = min(d, n.gone.since.Add(m.cfg.GoneNodeGrace).Sub(now))
		}
	}
	if m.nodeReader != nil && len(m.untrackedOwners()) > 0 {
		d = min(d, m.nextReview.Sub(now), m.cfg.RetryInterval)
	}
	return d
}
