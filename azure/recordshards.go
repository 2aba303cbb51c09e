package azure

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
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

// declaredShards is the shard count a record Lease was written with.
func declaredShards(l *coordinationv1.Lease) int {
	n, err := strconv.Atoi(l.Annotations[recordShardsAnnotation])
	if err != nil || n < 1 {
		return 1
	}
	return min(n, maxRecordShards)
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
