package azure

import (
	"context"
	"maps"
	"sync"
)

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
