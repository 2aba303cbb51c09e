package azure

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
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
	// recordShardsAnnotation is the number of Leases the record was split
	// into when this one was written (absent: 1, a record written before
	// records were sharded).
	recordShardsAnnotation = "nodeguard.io/record-shards"
)

// A pool's record is sharded: kube-apiserver holds at most 256 KiB of
// annotations per object, about 1,500 entries, and a zone outage or a large
// scale-down holds more of one pool Down at once (the 5,000-node target needs
// a whole pool). The entries are spread over a power of two of Leases by a
// hash of the entry name: shard 0 is the Lease named leaseName(pool) (a
// record of one shard is exactly the record of a single Lease, as written
// before records were sharded, so old records load and migrate by
// themselves), shard k the Lease named leaseName(pool)+"-k". Each shard holds
// at most recordShardBytes of entries, half of the object's limit, so the
// rest of its annotations always fit too. While the shard count stays, an
// entry always lives in the same shard and a save writes only the shards
// whose entries changed; when it grows (or shrinks), every entry still
// recorded is first written to its new shard, then dropped from its old one,
// so that a save that fails half-way never loses an entry: Load takes the
// union of the shards.
const (
	// recordShardBytes is the most entry bytes (JSON) one shard holds.
	recordShardBytes = 128 << 10
	// maxRecordShards bounds the shard count (and the names Load accepts):
	// 64 × 128 KiB = 8 MiB, about 50,000 entries.
	maxRecordShards = 64
)

// RecordCapacityBytes is the most entry bytes a pool's record holds.
const RecordCapacityBytes = recordShardBytes * maxRecordShards

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;create;update;delete,namespace=kube-node-maintenance

// LeaseRecords keeps each pool's record in Leases (no holder) in the
// maintenance namespace: a Lease per pool (more for a large record, see
// above), so that a write covers every node of the pool's batch, under the
// Lease permissions nodeguard holds already.
type LeaseRecords struct {
	client    client.Client
	reader    client.Reader // uncached
	namespace string

	mu sync.Mutex
	// last is the pool's shards as last read or written, so that a save
	// writes only the shards that change (a conflict reads them again).
	last map[string]*storedRecord
}

// storedRecord is a pool's record as stored: its Leases by shard index.
type storedRecord struct {
	shards map[int]*coordinationv1.Lease
	// count is the shard count of the last save (the most any shard
	// declares, after a load).
	count int
}

// NewLeaseRecords returns the Lease-backed store; reader must be uncached
// (a manager's API reader).
func NewLeaseRecords(c client.Client, reader client.Reader, namespace string) *LeaseRecords {
	return &LeaseRecords{client: c, reader: reader, namespace: namespace, last: map[string]*storedRecord{}}
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
// nodeguard's: Load reads a pool's record only from the Leases of this name
// (shard 0) and of this name followed by "-<k>" (shardName).
func leaseName(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return "lb-admin-state-" + hex.EncodeToString(sum[:10])
}

// shardName is the name of a pool's k-th record Lease.
func shardName(pool string, k int) string {
	if k == 0 {
		return leaseName(pool)
	}
	return leaseName(pool) + "-" + strconv.Itoa(k)
}

// shardOf reports which of pool's shards a Lease of this name is, if it is
// one nodeguard derives.
func shardOf(pool, name string) (int, bool) {
	base := leaseName(pool)
	if name == base {
		return 0, true
	}
	suffix, ok := strings.CutPrefix(name, base+"-")
	if !ok {
		return 0, false
	}
	k, err := strconv.Atoi(suffix)
	if err != nil || k < 1 || k >= maxRecordShards || strconv.Itoa(k) != suffix {
		return 0, false
	}
	return k, true
}

// entryShard is the shard of an entry among n.
func entryShard(entry string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(entry))
	return int(h.Sum32() % uint32(n))
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

// Load implements RecordStore. It lists by label, and takes a pool's record
// only from the Leases named after the pool: the label and annotations are
// anyone's to write, the names are the ones nodeguard creates. A pool's
// record is the union of its shards; an entry found in two (a save that
// failed while it moved the entries to another shard count) is taken as
// recorded Down if either says so, so that no Down owed a restore is lost.
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
	stored := map[string]*storedRecord{}
	for i := range list.Items {
		l := &list.Items[i]
		pool, rec, err := parseRecord(l)
		if err != nil {
			unreadable = append(unreadable, UnreadableRecord{Lease: l, Err: err})
			continue
		}
		k, ours := shardOf(pool, l.Name)
		if !ours {
			ignored = append(ignored, IgnoredRecord{Lease: l, Pool: pool})
			continue
		}
		st := stored[pool]
		if st == nil {
			st = &storedRecord{shards: map[int]*coordinationv1.Lease{}}
			stored[pool] = st
		}
		st.shards[k] = l
		st.count = max(st.count, declaredShards(l))
		merged := out[pool]
		if merged == nil {
			merged = poolRecord{}
			out[pool] = merged
		}
		for name, o := range rec {
			if prev, dup := merged[name]; dup && !prev.restored() {
				continue
			}
			merged[name] = o
		}
	}
	for pool, st := range stored {
		s.last[pool] = st
		recordShards.WithLabelValues(pool).Set(float64(len(st.shards)))
	}
	return out, unreadable, ignored, nil
}

// declaredShards is the shard count a record Lease was written with.
func declaredShards(l *coordinationv1.Lease) int {
	n, err := strconv.Atoi(l.Annotations[recordShardsAnnotation])
	if err != nil || n < 1 {
		return 1
	}
	return min(n, maxRecordShards)
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

// RecordTooLargeError is a record that does not fit in maxRecordShards
// Leases.
type RecordTooLargeError struct {
	Pool    string
	Entries int
	Bytes   int
}

func (e *RecordTooLargeError) Error() string {
	return fmt.Sprintf("the admin-state record of pool %s (%d entries, %d bytes) does not fit in %d Leases of %d bytes", e.Pool, e.Entries, e.Bytes, maxRecordShards, recordShardBytes)
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

// shardLayout splits a record into n shards, n the smallest power of two
// whose shards all hold at most recordShardBytes, but the current count as
// long as it holds them and the record needs more than a quarter of it (a
// record that shrinks and grows around a boundary does not move its entries
// every time). It returns the shards' JSON.
func shardLayout(pool string, rec poolRecord, current int) ([]string, error) {
	if len(rec) == 0 {
		return nil, nil
	}
	fits := func(n int) ([]string, bool, error) {
		parts := make([]poolRecord, n)
		for name, o := range rec {
			k := entryShard(name, n)
			if parts[k] == nil {
				parts[k] = poolRecord{}
			}
			parts[k][name] = o
		}
		out := make([]string, n)
		for k, p := range parts {
			if len(p) == 0 {
				continue
			}
			data, err := json.Marshal(p)
			if err != nil {
				return nil, false, err
			}
			if len(data) > recordShardBytes {
				return nil, false, nil
			}
			out[k] = string(data)
		}
		return out, true, nil
	}
	whole, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	// No fewer shards than the whole record needs: a large record is not
	// split once per smaller count first.
	n := 1
	for n < maxRecordShards && n*recordShardBytes < len(whole) {
		n *= 2
	}
	for ; n <= maxRecordShards; n *= 2 {
		out, ok, err := fits(n)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if current > n && current <= maxRecordShards && n*4 > current {
			if kept, ok, err := fits(current); err == nil && ok {
				return kept, nil
			}
		}
		return out, nil
	}
	return nil, &RecordTooLargeError{Pool: pool, Entries: len(rec), Bytes: len(whole)}
}

func (s *LeaseRecords) save(ctx context.Context, pool string, rec poolRecord) error {
	st := s.last[pool]
	if st == nil {
		var err error
		if st, err = s.read(ctx, pool); err != nil {
			return err
		}
		s.last[pool] = st
	}
	shards, err := shardLayout(pool, rec, st.count)
	if err != nil {
		return err
	}
	n := len(shards)
	if n != st.count && len(st.shards) > 0 {
		// The entries move: first add each to its new shard, keeping what
		// the shard holds, so that every entry is in some shard at all times.
		for k, data := range shards {
			if data == "" {
				continue
			}
			merged, grows, err := mergeShard(st.shards[k], data)
			if err != nil {
				return err
			}
			if grows {
				if err := s.put(ctx, st, pool, k, n, merged); err != nil {
					return err
				}
			}
		}
	}
	for k, data := range shards {
		if data == "" {
			continue
		}
		if l := st.shards[k]; l != nil && l.Annotations[recordEntriesAnnotation] == data && declaredShards(l) == n {
			continue
		}
		if err := s.put(ctx, st, pool, k, n, data); err != nil {
			return err
		}
	}
	for k := range st.shards {
		if k < n && shards[k] != "" {
			continue
		}
		err := s.client.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: shardName(pool, k)}})
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		delete(st.shards, k)
	}
	st.count = n
	if n == 0 {
		delete(s.last, pool)
		recordShards.DeleteLabelValues(pool)
	} else {
		recordShards.WithLabelValues(pool).Set(float64(len(st.shards)))
	}
	return nil
}

// mergeShard is a shard's stored entries with data's on top, and whether
// that adds any entry to the shard.
func mergeShard(l *coordinationv1.Lease, data string) (string, bool, error) {
	if l == nil {
		return data, true, nil
	}
	var have, add poolRecord
	if err := json.Unmarshal([]byte(l.Annotations[recordEntriesAnnotation]), &have); err != nil || have == nil {
		return data, true, nil
	}
	if err := json.Unmarshal([]byte(data), &add); err != nil {
		return "", false, err
	}
	grows := false
	for name, o := range add {
		if _, ok := have[name]; !ok {
			grows = true
		}
		have[name] = o
	}
	merged, err := json.Marshal(have)
	return string(merged), grows, err
}

// read gets a pool's shards from the API server.
func (s *LeaseRecords) read(ctx context.Context, pool string) (*storedRecord, error) {
	var list coordinationv1.LeaseList
	if err := s.reader.List(ctx, &list, client.InNamespace(s.namespace), client.MatchingLabels{recordLabel: recordLabelValue}); err != nil {
		return nil, err
	}
	st := &storedRecord{shards: map[int]*coordinationv1.Lease{}}
	for i := range list.Items {
		l := &list.Items[i]
		if k, ok := shardOf(pool, l.Name); ok && l.Annotations[recordPoolAnnotation] == pool {
			st.shards[k] = l
			st.count = max(st.count, declaredShards(l))
		}
	}
	return st, nil
}

// put writes one shard.
func (s *LeaseRecords) put(ctx context.Context, st *storedRecord, pool string, k, n int, data string) error {
	l := st.shards[k]
	if l == nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Namespace: s.namespace, Name: shardName(pool, k),
			Labels: map[string]string{recordLabel: recordLabelValue, "app.kubernetes.io/managed-by": "nodeguard"},
			Annotations: map[string]string{recordPoolAnnotation: pool, recordEntriesAnnotation: data,
				recordShardsAnnotation: strconv.Itoa(n)},
		}}
		if err := s.client.Create(ctx, l); err != nil {
			return err
		}
		st.shards[k] = l
		return nil
	}
	l = l.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[recordPoolAnnotation] = pool
	l.Annotations[recordEntriesAnnotation] = data
	l.Annotations[recordShardsAnnotation] = strconv.Itoa(n)
	if err := s.client.Update(ctx, l); err != nil {
		return err
	}
	st.shards[k] = l
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
