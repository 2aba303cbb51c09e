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
	markNodeWrite = "node"
	markEvict     = "evict"
	markEvicted   = "evicted"
)

// requestMark is one request of a timed deletion: a write of a node (Name is
// the node's), or an eviction sent or granted (the pod's namespace/name).
type requestMark struct {
	At   time.Time
	Kind string
	Name string
}

// markOf is the mark a request makes, if any: a write of a node (not its
// status) or an eviction sent.
func markOf(r *http.Request, verb, resource string) (kind, name string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case resource == "nodes" && (verb == "PATCH" || verb == "UPDATE") && len(parts) == 4:
		return markNodeWrite, parts[3] // api/v1/nodes/NAME
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
		if m.Kind != markNodeWrite {
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
