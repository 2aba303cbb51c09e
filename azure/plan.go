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
	plan := poolPlan{changed: map[string]bool{}, matched: map[string]bool{}, restoredAgain: poolRecord{}, held: map[string]bool{}, left: map[string]bool{}}
	before := maps.Clone(rec)
	if before == nil {
		before = poolRecord{}
	}
	release := map[string]bool{}
	restore := map[string]bool{}
	seen := map[string]bool{}
	for i, k := range keys {
		e := pool.Properties.LoadBalancerBackendAddresses[i]
		name := entryName(e)
		if name == "" {
			continue
		}
		seen[name] = true
		o, owned := rec[name]
		if owned {
			plan.matched[string(o.UID)] = true
		}
		if k != "" {
			plan.matched[k] = true
		}
		down := isDown(e.Properties.AdminState)
		switch {
		case k != "" && snap.desired[k] == AdminStateDown:
			if noDown {
				if !down || (owned && (o.UID != types.UID(k) || o.restored())) {
					plan.held[k] = true
				}
				continue
			}
			if !down {
				setState(e, AdminStateDown)
				plan.changed[k] = true
			}
			if !down || (owned && (o.UID != types.UID(k) || o.restored())) {
				before[name] = owner{UID: types.UID(k), Node: snap.names[types.UID(k)]}
			}
		case owned && o.restored():
			switch {
			case snap.desired[string(o.UID)] == AdminStateDown:
				// Its node is Down again: its own work records the entry.
			case !snap.holdsRestore(o, k):
				release[name] = true
			case down:
				setState(e, AdminStateNone)
				plan.changed[string(o.UID)] = true
				plan.restoredAgain[name] = o
			}
		case owned && (o.UID == types.UID(k) || snap.due[o.UID]):
			if down {
				setState(e, AdminStateNone)
				plan.changed[string(o.UID)] = true
			}
			if o.UID == types.UID(k) && snap.hold > 0 {
				restore[name] = true
			} else {
				release[name] = true
			}
		case owned && !down:
			release[name] = true
		}
	}
	for name, o := range rec {
		if !seen[name] {
			plan.matched[string(o.UID)] = true
			release[name] = true
			if !o.restored() {
				plan.left[string(o.UID)] = true
			}
		}
	}
	after := maps.Clone(before)
	for name := range release {
		delete(after, name)
	}
	for name := range restore {
		o := after[name]
		o.RestoredAt, o.GoneSince = ngv1alpha1.FormatTime(snap.now), ""
		after[name] = o
	}
	if !maps.Equal(before, rec) {
		plan.before = before
	}
	if !maps.Equal(after, before) {
		plan.after = after
	}
	return plan
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
