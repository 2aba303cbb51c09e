package azure

import (
	"maps"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// poolPlan is what one attempt does to a pool's entries and its record.
type poolPlan struct {
	// changed: nodes (by UID) whose entries the write changes.
	changed map[string]bool
	// matched: nodes with an entry in the pool, or with a recorded one.
	matched map[string]bool
	// restoredAgain: restored entries found Down that the write sets None
	// again (restore.go), by entry name.
	restoredAgain poolRecord
	// left: nodes with an entry recorded Down that is no longer in the
	// pool (its owner removed it).
	left map[string]bool
	// held: nodes whose Down waits for the record (a plan without Downs,
	// made after the save of one with them failed).
	held map[string]bool
	// before is the record to save before the write (entries it sets Down
	// are recorded first); after is the record once the write succeeded.
	// Either is nil when unchanged.
	before, after poolRecord
}

// planPool sets the admin state of the pool's entries (in place) for one
// write, from the fresh pool, the node each entry belongs to (keys, as
// Index.Match returns), the snapshot and the pool's record:
//
//   - an entry of a node whose desired state is Down is set Down and recorded
//     as set for that node, unless it is Down already; a Down recorded for
//     another node (a gone one with the same identity), or restored, passes
//     to this one as a Down;
//   - an entry restored to None and still held (restore.go) is set None
//     again if it is Down; once its hold is over, it leaves the record
//     without a write;
//   - an entry recorded Down for its node, whose desired state is None, is
//     set None and stays recorded as restored (for --azure-admin-state-restore-hold;
//     with 0 it leaves the record); one of a gone node that is due is set
//     None and leaves the record;
//   - a Down nodeguard did not record is never changed;
//   - a recorded entry that is no longer Down, or no longer in the pool,
//     leaves the record without a write.
//
// With noDown (the record could not be saved), no entry is set Down nor
// recorded for a new node: those nodes are held, and the restores go ahead.
func planPool(pool *armnetwork.BackendAddressPool, keys []string, snap snapshot, rec poolRecord, noDown bool) poolPlan {
	p := newPlanning(snap, rec, noDown)
	for i, k := range keys {
		p.entry(pool.Properties.LoadBalancerBackendAddresses[i], k)
	}
	p.entriesGone()
	p.records()
	return p.plan
}

// planning is planPool's state while it goes through the pool's entries.
type planning struct {
	snap   snapshot
	rec    poolRecord
	noDown bool
	plan   poolPlan
	// before is the record as it must stand before the write.
	before poolRecord
	// leaving: entries that leave the record once the write succeeded;
	// restoring: entries this write restores that stay recorded as
	// restored; seen: the entries found in the pool.
	leaving, restoring, seen map[string]bool
}

func newPlanning(snap snapshot, rec poolRecord, noDown bool) *planning {
	before := maps.Clone(rec)
	if before == nil {
		before = poolRecord{}
	}
	return &planning{
		snap: snap, rec: rec, noDown: noDown, before: before,
		plan:    poolPlan{changed: map[string]bool{}, matched: map[string]bool{}, restoredAgain: poolRecord{}, held: map[string]bool{}, left: map[string]bool{}},
		leaving: map[string]bool{}, restoring: map[string]bool{}, seen: map[string]bool{},
	}
}

// entry plans one entry of the pool, k the node it belongs to ("" when
// none).
func (p *planning) entry(e *armnetwork.LoadBalancerBackendAddress, k string) {
	name := entryName(e)
	if name == "" {
		return
	}
	p.seen[name] = true
	o, owned := p.rec[name]
	if owned {
		p.plan.matched[string(o.UID)] = true
	}
	if k != "" {
		p.plan.matched[k] = true
	}
	down := isDown(e.Properties.AdminState)
	switch {
	case k != "" && p.snap.desired[k] == AdminStateDown:
		p.setDown(e, name, k, o, owned, down)
	case owned && o.restored():
		p.keepRestored(e, name, k, o, down)
	case owned && (o.UID == types.UID(k) || p.snap.due[o.UID]):
		p.restore(e, name, k, o, down)
	case owned && !down:
		p.leaving[name] = true
	}
}

// setDown plans the entry of node k, whose desired state is Down: set Down
// and recorded for k unless it is Down already. A Down recorded for another
// node (a gone one with the same identity), or restored, passes to k as a
// Down. With noDown, k is held instead.
func (p *planning) setDown(e *armnetwork.LoadBalancerBackendAddress, name, k string, o owner, owned, down bool) {
	takeOver := owned && (o.UID != types.UID(k) || o.restored())
	if p.noDown {
		if !down || takeOver {
			p.plan.held[k] = true
		}
		return
	}
	if !down {
		setState(e, AdminStateDown)
		p.plan.changed[k] = true
	}
	if !down || takeOver {
		p.before[name] = owner{UID: types.UID(k), Node: p.snap.names[types.UID(k)]}
	}
}

// keepRestored plans an entry restored to None and still recorded: set None
// again while its hold lasts, out of the record once it is over.
func (p *planning) keepRestored(e *armnetwork.LoadBalancerBackendAddress, name, k string, o owner, down bool) {
	switch {
	case p.snap.desired[string(o.UID)] == AdminStateDown:
		// Its node is Down again: its own work records the entry.
	case !p.snap.holdsRestore(o, k):
		p.leaving[name] = true
	case down:
		setState(e, AdminStateNone)
		p.plan.changed[string(o.UID)] = true
		p.plan.restoredAgain[name] = o
	}
}

// restore plans an entry recorded Down for its node, now None, or for a
// gone node that is due: set None, then recorded as restored while
// --azure-admin-state-restore-hold lasts (a gone node's leaves the record).
func (p *planning) restore(e *armnetwork.LoadBalancerBackendAddress, name, k string, o owner, down bool) {
	if down {
		setState(e, AdminStateNone)
		p.plan.changed[string(o.UID)] = true
	}
	if o.UID == types.UID(k) && p.snap.hold > 0 {
		p.restoring[name] = true
	} else {
		p.leaving[name] = true
	}
}

// entriesGone takes the recorded entries that are no longer in the pool
// (their owner removed them) out of the record; a Down among them is noted
// as left.
func (p *planning) entriesGone() {
	for name, o := range p.rec {
		if p.seen[name] {
			continue
		}
		p.plan.matched[string(o.UID)] = true
		p.leaving[name] = true
		if !o.restored() {
			p.plan.left[string(o.UID)] = true
		}
	}
}

// records sets the record to save before the write and the one once it
// succeeded, each left nil when unchanged.
func (p *planning) records() {
	after := maps.Clone(p.before)
	for name := range p.leaving {
		delete(after, name)
	}
	for name := range p.restoring {
		o := after[name]
		o.RestoredAt, o.GoneSince = ngv1alpha1.FormatTime(p.snap.now), ""
		after[name] = o
	}
	if !maps.Equal(p.before, p.rec) {
		p.plan.before = p.before
	}
	if !maps.Equal(after, p.before) {
		p.plan.after = after
	}
}

// holdsRestore reports whether a restored entry, matched to node k, is
// still held: within its window, still its node's (no other node matches
// it), and its node neither gone nor replaced.
func (s snapshot) holdsRestore(o owner, k string) bool {
	if k != "" && types.UID(k) != o.UID {
		return false
	}
	if _, gone := s.due[o.UID]; gone || s.ended[o.UID] {
		return false
	}
	return holdsRestore(o, s.now, s.hold)
}

// entryName identifies an entry within its pool.
func entryName(e *armnetwork.LoadBalancerBackendAddress) string {
	if e == nil || e.Properties == nil {
		return ""
	}
	if e.Name != nil && *e.Name != "" {
		return *e.Name
	}
	if e.Properties.IPAddress != nil {
		return *e.Properties.IPAddress
	}
	if c := e.Properties.NetworkInterfaceIPConfiguration; c != nil && c.ID != nil {
		return *c.ID
	}
	return ""
}

func isDown(s *armnetwork.LoadBalancerBackendAddressAdminState) bool {
	return s != nil && *s == armnetwork.LoadBalancerBackendAddressAdminStateDown
}

func setState(e *armnetwork.LoadBalancerBackendAddress, state AdminState) {
	s := armnetwork.LoadBalancerBackendAddressAdminState(state)
	e.Properties.AdminState = &s
}
