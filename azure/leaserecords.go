package azure

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

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

// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;create;update;delete,namespace=kube-node-maintenance

// LeaseRecords keeps each pool's record in Leases (no holder) in the
// maintenance namespace: a Lease per pool (more for a large record, see
// recordshards.go), so that a write covers every node of the pool's batch,
// under the Lease permissions nodeguard holds already.
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

// save writes pool's record as shardLayout splits it, in an order that
// never leaves an entry in no shard, should it stop half-way: when the shard
// count changes, every entry is first added to its new shard; then each
// shard is written, and only then are the shards no longer used deleted.
// The caller holds s.mu.
func (s *LeaseRecords) save(ctx context.Context, pool string, rec poolRecord) error {
	st, err := s.stored(ctx, pool)
	if err != nil {
		return err
	}
	shards, err := shardLayout(pool, rec, st.count)
	if err != nil {
		return err
	}
	n := len(shards)
	if n != st.count && len(st.shards) > 0 {
		if err := s.addToNewShards(ctx, st, pool, shards); err != nil {
			return err
		}
	}
	if err := s.writeShards(ctx, st, pool, shards); err != nil {
		return err
	}
	if err := s.deleteUnusedShards(ctx, st, pool, shards); err != nil {
		return err
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

// stored is pool's shards as last read or written, read from the API
// server when not known.
func (s *LeaseRecords) stored(ctx context.Context, pool string) (*storedRecord, error) {
	if st := s.last[pool]; st != nil {
		return st, nil
	}
	st, err := s.read(ctx, pool)
	if err != nil {
		return nil, err
	}
	s.last[pool] = st
	return st, nil
}

// addToNewShards adds each entry to its shard under the new count, keeping
// what the shard holds, so that every entry is in some shard at all times
// while the entries move.
func (s *LeaseRecords) addToNewShards(ctx context.Context, st *storedRecord, pool string, shards []string) error {
	for k, data := range shards {
		if data == "" {
			continue
		}
		merged, grows, err := mergeShard(st.shards[k], data)
		if err != nil {
			return err
		}
		if grows {
			if err := s.put(ctx, st, pool, k, len(shards), merged); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeShards writes each shard whose entries or count changed.
func (s *LeaseRecords) writeShards(ctx context.Context, st *storedRecord, pool string, shards []string) error {
	n := len(shards)
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
	return nil
}

// deleteUnusedShards deletes the stored shards that hold no entry now.
func (s *LeaseRecords) deleteUnusedShards(ctx context.Context, st *storedRecord, pool string, shards []string) error {
	for k := range st.shards {
		if k < len(shards) && shards[k] != "" {
			continue
		}
		err := s.client.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: shardName(pool, k)}})
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		delete(st.shards, k)
	}
	return nil
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
