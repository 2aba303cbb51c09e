package main

import (
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMarkOf(t *testing.T) {
	for _, c := range []struct {
		method, path, kind, name string
	}{
		{"PATCH", "/api/v1/nodes/n1", markNodeWrite, "n1"},
		{"PUT", "/api/v1/nodes/n1", markNodeWrite, "n1"},
		{"PATCH", "/api/v1/nodes/n1/status", markStatusWrite, "n1"},
		{"GET", "/api/v1/nodes/n1/status", "", ""},
		{"DELETE", "/api/v1/nodes/n1", "", ""},
		{"POST", "/api/v1/namespaces/web/pods/web-1/eviction", markEvict, "web/web-1"},
		{"GET", "/api/v1/namespaces/web/pods/web-1", "", ""},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		verb, resource := classify(r)
		if kind, name := markOf(r, verb, resource); kind != c.kind || name != c.name {
			t.Errorf("%s %s: mark %q %q, want %q %q", c.method, c.path, kind, name, c.kind, c.name)
		}
	}
}

// TestPhasesOf: each node's first write, first eviction sent and last
// eviction granted come from the marks of its pods; nodes are ordered by when
// they went, and marks of pods on no node of the set are ignored.
func TestPhasesOf(t *testing.T) {
	start := time.Now()
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	marks := []requestMark{
		{at(0.5), markNodeWrite, "a"},
		{at(0.6), markNodeWrite, "b"},
		{at(1), markEvict, "ns/a-1"},
		{at(1.2), markEvicted, "ns/a-1"},
		{at(2), markEvict, "ns/a-2"},
		{at(3), markEvicted, "ns/a-2"},
		{at(4), markNodeWrite, "a"}, // the finalizer's removal
		{at(5), markEvict, "ns/b-1"},
		{at(6), markEvicted, "ns/b-1"},
		{at(7), markEvict, "ns/elsewhere"},
	}
	podNode := map[string]string{"ns/a-1": "a", "ns/a-2": "a", "ns/b-1": "b", "ns/elsewhere": "z"}
	got := phasesOf(start, marks, podNode, map[string]time.Duration{"a": 5 * time.Second, "b": 8 * time.Second})
	want := []nodePhases{
		{Node: "a", Written: 500 * time.Millisecond, FirstEviction: time.Second, LastEvicted: 3 * time.Second, Gone: 5 * time.Second},
		{Node: "b", Written: 600 * time.Millisecond, FirstEviction: 5 * time.Second, LastEvicted: 6 * time.Second, Gone: 8 * time.Second},
	}
	if len(got) != len(want) {
		t.Fatalf("phases %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("phases[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	summary := phasesSummary(got, 1, 1)
	for _, part := range []string{"first 1 nodes gone: written 0.500 s, first eviction 1.00 s", "last 1: written 0.600 s, first eviction 5.00 s, last eviction granted 6.00 s, gone 8.00 s"} {
		if !strings.Contains(summary, part) {
			t.Errorf("summary %q does not say %q", summary, part)
		}
	}
}

// TestEvictionTimesOf: a round trip runs from an eviction's last request
// (after a 429) to its grant, bare pods and pods under PDBs apart; a pod
// under a PDB also counts how long after its node's first eviction it was
// first sent; the longest PDB chain is the PDB whose evictions spanned the
// longest, from its first request to its last grant.
func TestEvictionTimesOf(t *testing.T) {
	start := time.Now()
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	marks := []requestMark{
		{at(1), markEvict, "ns/bare"},
		{at(1.5), markEvict, "ns/web"}, // refused: 429, no grant
		{at(1.25), markEvicted, "ns/bare"},
		{at(4), markEvict, "ns/web"},
		{at(4.5), markEvicted, "ns/web"},
		{at(5), markEvicted, "ns/unsent"}, // a grant without its request: not counted
	}
	podNode := map[string]string{"ns/bare": "a", "ns/web": "a", "ns/unsent": "a"}
	got := evictionTimesOf(start, marks, podNode, map[string]string{"ns/web": "web", "ns/unsent": "web"}, []nodePhases{{Node: "a", FirstEviction: time.Second}})
	if !slices.Equal(got.BareRoundTrips, []time.Duration{250 * time.Millisecond}) ||
		!slices.Equal(got.PDBRoundTrips, []time.Duration{500 * time.Millisecond}) ||
		!slices.Equal(got.PDBSentAfterFirst, []time.Duration{500 * time.Millisecond}) {
		t.Errorf("times %+v; want bare 250ms, under PDBs 500ms (from the request after the 429), sent 500ms after the node's first", got)
	}
	// web's chain runs from its first request (the refused one) to its grant.
	if want := (pdbChain{PDB: "web", Granted: 1, Span: 3 * time.Second, RoundTrips: 500 * time.Millisecond}); got.Longest != want {
		t.Errorf("longest chain %+v, want %+v", got.Longest, want)
	}
	// api's two evictions, one after the other, span longer than web's one.
	marks = append(marks, requestMark{at(2), markEvict, "ns/api-1"}, requestMark{at(3), markEvicted, "ns/api-1"},
		requestMark{at(3.5), markEvict, "ns/api-2"}, requestMark{at(7), markEvicted, "ns/api-2"})
	podNode["ns/api-1"], podNode["ns/api-2"] = "a", "a"
	both := evictionTimesOf(start, marks, podNode, map[string]string{"ns/web": "web", "ns/api-1": "api", "ns/api-2": "api"}, nil)
	if want := (pdbChain{PDB: "api", Granted: 2, Span: 5 * time.Second, RoundTrips: 4500 * time.Millisecond}); both.Longest != want {
		t.Errorf("longest of two chains %+v, want %+v", both.Longest, want)
	}
	if s := got.summary(); !strings.Contains(s, "bare pods 0.250 s / 0.250 s / 0.250 s (n 1)") ||
		!strings.Contains(s, "the longest PDB chain, web: 1 evictions granted in 3.00 s") {
		t.Errorf("summary %q", s)
	}
}

// TestStatusWritesElsewhere: status writes of nodes outside the deleted set
// are counted apart; those of the set's nodes, and node writes, are not.
func TestStatusWritesElsewhere(t *testing.T) {
	now := time.Now()
	marks := []requestMark{
		{now, markStatusWrite, "a"},
		{now, markStatusWrite, "outside"},
		{now, markStatusWrite, "outside"},
		{now, markNodeWrite, "other"},
	}
	if got := statusWritesElsewhere(marks, map[string]time.Duration{"a": time.Second}); got != 2 {
		t.Errorf("%d status writes outside the set, want 2", got)
	}
}
