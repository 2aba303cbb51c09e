package azure

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Down never outlives its node: before a write sets an entry Down, nodeguard
// records which node (by UID) it set it Down for, in a record that outlives
// the node and nodeguard itself. A Down is restored to None only where
// nodeguard set it, so a Down set by someone else is never undone; and when
// the node is gone (replaced by a node of the same name, or gone for the
// grace period) its recorded entries are restored.

// owner is the node an entry was set Down for.
type owner struct {
	UID  types.UID `json:"uid"`
	Node string    `json:"node"`
	// GoneSince is when nodeguard first saw the node gone (RFC 3339), empty
	// while it exists.
	GoneSince string `json:"goneSince,omitempty"`
	// RestoredAt is when nodeguard restored the entry to None for its node
	// (RFC 3339); empty while the entry is held Down. A restore is held too
	// (restore.go): another writer's stale copy can put the entry back Down,
	// so the entry stays recorded for --azure-admin-state-restore-hold.
	// Records written before the field existed have none: all Down.
	RestoredAt string `json:"restoredAt,omitempty"`
}

// restored reports whether the entry is held None, not Down.
func (o owner) restored() bool { return o.RestoredAt != "" }

// poolRecord is one backend pool's entries that nodeguard set Down, or
// restored and still holds None, by entry name.
type poolRecord map[string]owner

// RecordStore keeps the pool records durably.
type RecordStore interface {
	// Load returns every readable pool's record, by pool key, the records
	// it skipped because they cannot be read, and those it ignored because
	// they are not nodeguard's.
	Load(ctx context.Context) (map[string]poolRecord, []UnreadableRecord, []IgnoredRecord, error)
	// Save replaces a pool's record; an empty record removes it.
	Save(ctx context.Context, pool string, rec poolRecord) error
}

// UnreadableRecord is a record Lease whose annotations do not parse. Load
// skips it: one bad record must not stop the writes of every pool.
type UnreadableRecord struct {
	Lease *coordinationv1.Lease
	Err   error
}

func (u UnreadableRecord) Error() string {
	return fmt.Sprintf("admin-state record %s/%s is unreadable (annotations %s, %s): %v",
		u.Lease.Namespace, u.Lease.Name, recordPoolAnnotation, recordEntriesAnnotation, u.Err)
}

// IgnoredRecord is a Lease that carries a record for a pool but is not one
// of the Leases nodeguard keeps for that pool (leaseName, shardName). Other
// maintenance tools may create Leases in the namespace, so anyone among them
// could write a second record claiming a pool: Load ignores it, so that it
// can neither make nodeguard restore a Down it did not set nor forget one it
// did.
type IgnoredRecord struct {
	Lease *coordinationv1.Lease
	Pool  string
}

func (r IgnoredRecord) Error() string {
	return fmt.Sprintf("Lease %s/%s claims to be the admin-state record of backend pool %s (annotation %s), but nodeguard keeps that pool's record in Lease %s/%s (and, for a large record, %s-<n>)",
		r.Lease.Namespace, r.Lease.Name, r.Pool, recordPoolAnnotation, r.Lease.Namespace, leaseName(r.Pool), leaseName(r.Pool))
}

// RecordedDown is one backend-pool entry nodeguard set Down for a node and
// has not restored yet (entries it restored and holds None are not listed).
type RecordedDown struct {
	Pool  string // "<load balancer>/<pool>"
	Entry string
	Node  string
	UID   types.UID
}

// ListRecordedDowns reads the records kept in namespace, sorted by pool and
// entry (for nodeguard uninstall, which has to say what nobody will restore).
func ListRecordedDowns(ctx context.Context, reader client.Reader, namespace string) ([]RecordedDown, error) {
	pools, unreadable, _, err := NewLeaseRecords(nil, reader, namespace).Load(ctx)
	if err != nil {
		return nil, err
	}
	if len(unreadable) > 0 {
		// A listing for a person: say what cannot be listed.
		return nil, unreadable[0]
	}
	var out []RecordedDown
	for pool, rec := range pools {
		for entry, o := range rec {
			if !o.restored() {
				out = append(out, RecordedDown{Pool: pool, Entry: entry, Node: o.Node, UID: o.UID})
			}
		}
	}
	slices.SortFunc(out, func(a, b RecordedDown) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Entry, b.Entry))
	})
	return out, nil
}
