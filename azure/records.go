package azure

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
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

// Records label and annotations.
const (
	recordLabel             = "nodeguard.io/record"
	recordLabelValue        = "load-balancer-admin-state"
	recordPoolAnnotation    = "nodeguard.io/backend-pool"
	recordEntriesAnnotation = "nodeguard.io/entries-set-down"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;create;update;delete,namespace=kube-node-maintenance

// LeaseRecords keeps each pool's record in a Lease (no holder) in the
// maintenance namespace: a Lease per pool, so that a write covers every node
// of the pool's batch, under the Lease permissions nodeguard holds already.
type LeaseRecords struct {
	client    client.Client
	reader    client.Reader // uncached
	namespace string

	mu sync.Mutex
	// last is the Lease last read or written per pool, so that a save is
	// one update (a conflict reads it again).
	last map[string]*coordinationv1.Lease
}

// NewLeaseRecords returns the Lease-backed store; reader must be uncached
// (a manager's API reader).
func NewLeaseRecords(c client.Client, reader client.Reader, namespace string) *LeaseRecords {
	return &LeaseRecords{client: c, reader: reader, namespace: namespace, last: map[string]*coordinationv1.Lease{}}
}

// InCluster returns the options nodeguard runs with: records in Leases of
// the maintenance namespace (uncached reads through apiReader), and nodes
// read from c.
func InCluster(c client.Client, apiReader client.Reader) []ManagerOption {
	return []ManagerOption{
		WithRecords(NewLeaseRecords(c, apiReader, ngv1alpha1.MaintenanceLeaseNamespace)),
		WithNodeReader(c),
	}
}

// leaseName is a DNS-safe name for a pool key (pool names may hold
// characters a Lease name cannot). It is also what makes a record
// nodeguard's: Load reads a pool's record only from the Lease of this name.
func leaseName(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return "lb-admin-state-" + hex.EncodeToString(sum[:10])
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

// IgnoredRecord is a Lease that carries a record for a pool but is not the
// Lease nodeguard keeps for that pool (leaseName). Other maintenance tools
// may create Leases in the namespace, so anyone among them could write a
// second record claiming a pool: Load ignores it, so that it can neither
// make nodeguard restore a Down it did not set nor forget one it did.
type IgnoredRecord struct {
	Lease *coordinationv1.Lease
	Pool  string
}

func (r IgnoredRecord) Error() string {
	return fmt.Sprintf("Lease %s/%s claims to be the admin-state record of backend pool %s (annotation %s), but nodeguard keeps that pool's record in Lease %s/%s",
		r.Lease.Namespace, r.Lease.Name, r.Pool, recordPoolAnnotation, r.Lease.Namespace, leaseName(r.Pool))
}

// Load implements RecordStore. It lists by label, and takes a pool's record
// only from the Lease named after the pool: the label and annotations are
// anyone's to write, the name is the one nodeguard creates.
func (s *LeaseRecords) Load(ctx context.Context) (map[string]poolRecord, []UnreadableRecord, []IgnoredRecord, error) {
	var list coordinationv1.LeaseList
	if err := s.reader.List(ctx, &list, client.InNamespace(s.namespace), client.MatchingLabels{recordLabel: recordLabelValue}); err != nil {
		return nil, nil, nil, fmt.Errorf("listing admin-state records in %s: %w", s.namespace, err)
	}
	out := map[string]poolRecord{}
	var unreadable []UnreadableRecord
	var ignored []IgnoredRecord
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range list.Items {
		l := &list.Items[i]
		pool, rec, err := parseRecord(l)
		switch {
		case err != nil:
			unreadable = append(unreadable, UnreadableRecord{Lease: l, Err: err})
		case l.Name != leaseName(pool):
			ignored = append(ignored, IgnoredRecord{Lease: l, Pool: pool})
		default:
			out[pool] = rec
			s.last[pool] = l
		}
	}
	return out, unreadable, ignored, nil
}

// parseRecord reads a record Lease's pool and entries.
func parseRecord(l *coordinationv1.Lease) (string, poolRecord, error) {
	pool := l.Annotations[recordPoolAnnotation]
	if pool == "" {
		return "", nil, fmt.Errorf("annotation %s is empty", recordPoolAnnotation)
	}
	var rec poolRecord
	if err := json.Unmarshal([]byte(l.Annotations[recordEntriesAnnotation]), &rec); err != nil {
		return "", nil, fmt.Errorf("annotation %s: %w", recordEntriesAnnotation, err)
	}
	return pool, rec, nil
}

// Save implements RecordStore.
func (s *LeaseRecords) Save(ctx context.Context, pool string, rec poolRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.save(ctx, pool, rec); err != nil {
		delete(s.last, pool) // read it again next time
		return fmt.Errorf("saving admin-state record of pool %s: %w", pool, err)
	}
	return nil
}

func (s *LeaseRecords) save(ctx context.Context, pool string, rec poolRecord) error {
	name := leaseName(pool)
	if len(rec) == 0 {
		delete(s.last, pool)
		err := s.client.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: name}})
		return client.IgnoreNotFound(err)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	l := s.last[pool]
	if l == nil {
		l = &coordinationv1.Lease{}
		err := s.reader.Get(ctx, types.NamespacedName{Namespace: s.namespace, Name: name}, l)
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
				Namespace: s.namespace, Name: name,
				Labels:      map[string]string{recordLabel: recordLabelValue, "app.kubernetes.io/managed-by": "nodeguard"},
				Annotations: map[string]string{recordPoolAnnotation: pool, recordEntriesAnnotation: string(data)},
			}}
			if err := s.client.Create(ctx, l); err != nil {
				return err
			}
			s.last[pool] = l
			return nil
		}
		if err != nil {
			return err
		}
	}
	l = l.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[recordPoolAnnotation] = pool
	l.Annotations[recordEntriesAnnotation] = string(data)
	if err := s.client.Update(ctx, l); err != nil {
		return err
	}
	s.last[pool] = l
	return nil
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

// MemoryRecords is a RecordStore that lives as long as the process: for
// tests, and the default when none is given.
type MemoryRecords struct {
	mu    sync.Mutex
	pools map[string]poolRecord
	// Fail, when set, makes Save fail (fault injection).
	Fail error
}

// NewMemoryRecords returns an empty in-memory store.
func NewMemoryRecords() *MemoryRecords { return &MemoryRecords{pools: map[string]poolRecord{}} }

// Load implements RecordStore.
func (s *MemoryRecords) Load(context.Context) (map[string]poolRecord, []UnreadableRecord, []IgnoredRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]poolRecord, len(s.pools))
	for k, r := range s.pools {
		out[k] = maps.Clone(r)
	}
	return out, nil, nil, nil
}

// Save implements RecordStore.
func (s *MemoryRecords) Save(_ context.Context, pool string, rec poolRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Fail != nil {
		return s.Fail
	}
	if len(rec) == 0 {
		delete(s.pools, pool)
	} else {
		s.pools[pool] = maps.Clone(rec)
	}
	return nil
}

// Entries returns the entries recorded Down per pool, as "entry=node".
func (s *MemoryRecords) Entries() map[string]map[string]string { return s.entries(false) }

// Restored returns the entries restored and held None per pool, as
// "entry=node".
func (s *MemoryRecords) Restored() map[string]map[string]string { return s.entries(true) }

func (s *MemoryRecords) entries(restored bool) map[string]map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]string{}
	for k, r := range s.pools {
		for e, o := range r {
			if o.restored() != restored {
				continue
			}
			if out[k] == nil {
				out[k] = map[string]string{}
			}
			out[k][e] = o.Node
		}
	}
	return out
}
