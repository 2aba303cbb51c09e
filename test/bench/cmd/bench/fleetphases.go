package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/test/bench"
)

// A fleet deletion's time is when its last node went; where a node's time
// went is in its requests. The request counter marks, while a deletion is
// timed, each write of a node and each eviction sent and granted; with the
// pods each node held, they give every node's steps: its first write (the
// cordon), its first eviction sent (its drain began: for nodeguard, it held
// a drain slot), its last eviction granted, and when it was gone.

// Kinds of requestMark.
const (
	markNodeWrite   = "node"
	markStatusWrite = "status"
	markEvict       = "evict"
	markEvicted     = "evicted"
)

// requestMark is one request of a timed deletion: a write of a node or its
// status (Name is the node's), or an eviction sent or granted (the pod's
// namespace/name).
type requestMark struct {
	At   time.Time
	Kind string
	Name string
}

// markOf is the mark a request makes, if any: a write of a node, of its
// status, or an eviction sent.
func markOf(r *http.Request, verb, resource string) (kind, name string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case resource == "nodes" && (verb == "PATCH" || verb == "UPDATE") && len(parts) == 4:
		return markNodeWrite, parts[3] // api/v1/nodes/NAME
	case resource == "nodes/status" && (verb == "PATCH" || verb == "UPDATE") && len(parts) == 5:
		return markStatusWrite, parts[3] // api/v1/nodes/NAME/status
	case resource == "pods/eviction" && verb == "CREATE" && len(parts) == 7:
		return markEvict, parts[3] + "/" + parts[5] // api/v1/namespaces/NS/pods/NAME/eviction
	}
	return "", ""
}

// nodePhases is when, from the deletion's start, a node was first written,
// its first eviction sent, its last eviction granted, and it was gone (zero:
// never, e.g. a node without pods has no eviction).
type nodePhases struct {
	Node          string        `json:"node"`
	Written       time.Duration `json:"firstWrite,omitempty"`
	FirstEviction time.Duration `json:"firstEviction,omitempty"`
	LastEvicted   time.Duration `json:"lastEvicted,omitempty"`
	Gone          time.Duration `json:"gone"`
}

// phasesOf reads each node's steps from the marks, given the node each pod
// was on and when each node went; ordered by when they went.
func phasesOf(start time.Time, marks []requestMark, podNode map[string]string, gone map[string]time.Duration) []nodePhases {
	byNode := map[string]*nodePhases{}
	for node, at := range gone {
		byNode[node] = &nodePhases{Node: node, Gone: at}
	}
	for _, m := range marks {
		node := m.Name
		switch m.Kind {
		case markStatusWrite:
			continue // not a step (statusWritesElsewhere counts them)
		case markEvict, markEvicted:
			node = podNode[m.Name]
		}
		p := byNode[node]
		if p == nil {
			continue
		}
		at := m.At.Sub(start)
		switch m.Kind {
		case markNodeWrite:
			p.Written = earliest(p.Written, at)
		case markEvict:
			p.FirstEviction = earliest(p.FirstEviction, at)
		case markEvicted:
			p.LastEvicted = max(p.LastEvicted, at)
		}
	}
	out := make([]nodePhases, 0, len(byNode))
	for _, p := range byNode {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b nodePhases) int {
		if c := a.Gone - b.Gone; c != 0 {
			return int(c)
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out
}

// earliest is the earlier of two times, zero meaning none yet.
func earliest(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}

// phasesSummary says, for the first n nodes to go and the last m, the
// median of each step, e.g. "first 10 nodes: written 0.4 s, first eviction
// 3.1 s, last eviction granted 20.0 s, gone 24.0 s".
func phasesSummary(phases []nodePhases, first, last int) string {
	if len(phases) == 0 {
		return ""
	}
	first, last = min(first, len(phases)), min(last, len(phases))
	return fmt.Sprintf("first %d nodes gone: %s; last %d: %s", first, stepMedians(phases[:first]), last, stepMedians(phases[len(phases)-last:]))
}

func stepMedians(phases []nodePhases) string {
	step := func(f func(nodePhases) time.Duration) string {
		var ds []time.Duration
		for _, p := range phases {
			if d := f(p); d > 0 {
				ds = append(ds, d)
			}
		}
		if len(ds) == 0 {
			return "none"
		}
		slices.Sort(ds)
		return bench.Seconds(ds[len(ds)/2])
	}
	return fmt.Sprintf("written %s, first eviction %s, last eviction granted %s, gone %s (medians)",
		step(func(p nodePhases) time.Duration { return p.Written }),
		step(func(p nodePhases) time.Duration { return p.FirstEviction }),
		step(func(p nodePhases) time.Duration { return p.LastEvicted }),
		step(func(p nodePhases) time.Duration { return p.Gone }))
}

// evictionTimes split a node's eviction time: each eviction's round trip
// (its last request sent until it was granted), for bare pods and for pods
// under a PDB apart, and how long after its node's first eviction each
// PDB-protected pod's was first sent (its wait in its PDB's queue, for
// nodeguard, or behind 429s, for kubectl). Longest is the PDB whose
// evictions spanned the longest time.
type evictionTimes struct {
	BareRoundTrips    []time.Duration `json:"bareRoundTrips,omitempty"`
	PDBRoundTrips     []time.Duration `json:"pdbRoundTrips,omitempty"`
	PDBSentAfterFirst []time.Duration `json:"pdbSentAfterNodeFirst,omitempty"`
	Longest           pdbChain        `json:"longestPDBChain"`
}

// pdbChain is one PDB's evictions in a deletion: how many were granted, the
// time from its first sent to its last granted, and the sum of their round
// trips. A drainer that sends one at a time per PDB spends the span waiting
// on them, their round trips and the gaps between: the round trips are a
// floor under its time that the PDB's budget does not lift.
type pdbChain struct {
	PDB        string        `json:"pdb,omitempty"`
	Granted    int           `json:"granted,omitempty"`
	Span       time.Duration `json:"span,omitempty"`
	RoundTrips time.Duration `json:"roundTrips,omitempty"`
}

// evictionTimesOf reads the eviction times from the marks; pdbOf names the
// PDB (its Deployment) of each pod (namespace/name) under one, phases give
// each node's first eviction.
func evictionTimesOf(start time.Time, marks []requestMark, podNode, pdbOf map[string]string, phases []nodePhases) evictionTimes {
	firstOf := map[string]time.Duration{}
	for _, p := range phases {
		firstOf[p.Node] = p.FirstEviction
	}
	lastSent, firstSent := map[string]time.Time{}, map[string]time.Time{}
	chains, began := map[string]*pdbChain{}, map[string]time.Time{}
	var t evictionTimes
	for _, m := range marks {
		switch m.Kind {
		case markEvict:
			lastSent[m.Name] = m.At
			if _, ok := firstSent[m.Name]; !ok {
				firstSent[m.Name] = m.At
			}
			if pdb := pdbOf[m.Name]; pdb != "" && began[pdb].IsZero() {
				began[pdb] = m.At
			}
		case markEvicted:
			sent, ok := lastSent[m.Name]
			if !ok {
				continue
			}
			pdb := pdbOf[m.Name]
			if pdb == "" {
				t.BareRoundTrips = append(t.BareRoundTrips, m.At.Sub(sent))
				continue
			}
			t.PDBRoundTrips = append(t.PDBRoundTrips, m.At.Sub(sent))
			if first, ok := firstOf[podNode[m.Name]]; ok && first > 0 {
				t.PDBSentAfterFirst = append(t.PDBSentAfterFirst, max(firstSent[m.Name].Sub(start)-first, 0))
			}
			c := chains[pdb]
			if c == nil {
				c = &pdbChain{PDB: pdb}
				chains[pdb] = c
			}
			c.Granted++
			c.RoundTrips += m.At.Sub(sent)
			c.Span = m.At.Sub(began[pdb])
		}
	}
	for _, c := range chains {
		if c.Span > t.Longest.Span || c.Span == t.Longest.Span && c.PDB < t.Longest.PDB {
			t.Longest = *c
		}
	}
	return t
}

// summary says the times' p50 / p90 / max, e.g. "eviction round trips
// (p50 / p90 / max): bare pods 0.4 s / 1.2 s / 2.0 s, …".
func (t evictionTimes) summary() string {
	q := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "none"
		}
		return fmt.Sprintf("%s / %s / %s (n %d)", bench.Seconds(bench.Percentile(ds, 50)), bench.Seconds(bench.Percentile(ds, 90)), bench.Seconds(bench.Percentile(ds, 100)), len(ds))
	}
	s := fmt.Sprintf("eviction round trips, last request sent until granted (p50 / p90 / max): bare pods %s, pods under PDBs %s; pods under PDBs first sent after their node's first eviction: %s",
		q(t.BareRoundTrips), q(t.PDBRoundTrips), q(t.PDBSentAfterFirst))
	if c := t.Longest; c.Granted > 0 {
		s += fmt.Sprintf("; the longest PDB chain, %s: %d evictions granted in %s from its first sent to its last granted, their round trips %s in all",
			c.PDB, c.Granted, bench.Seconds(c.Span), bench.Seconds(c.RoundTrips))
	}
	return s
}

// statusWritesElsewhere counts the status writes of nodes outside the
// deleted set (gone names the set): drains the drainer follows on other
// nodes, which a count per deleted node would otherwise charge to the set.
func statusWritesElsewhere(marks []requestMark, set map[string]time.Duration) int {
	n := 0
	for _, m := range marks {
		if _, in := set[m.Name]; m.Kind == markStatusWrite && !in {
			n++
		}
	}
	return n
}
