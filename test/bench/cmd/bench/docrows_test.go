package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/test/bench"
)

func secs(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// replaceResults is a run of the replace section alone.
func replaceResults() *results {
	return &results{Config: map[string]any{"quick": false}, Replace: &replaceResult{
		Profile: "pod-fast", Timeout: 5 * time.Minute, KubectlExit: secs(300.9), KubectlRefusals: 60, KubectlRequests: 60,
		NodeguardReleased: secs(10.6), MinReady: [2]int{1, 1}, Restarts: 1,
	}}
}

// TestSummaryRowsRenderTheRunsComparisons: a run's drain section renders
// nodeguard's time, the comparator's, the ratios to the bound and the term
// that binds, and the refused evictions; the sections that did not run
// render no row.
func TestSummaryRowsRenderTheRunsComparisons(t *testing.T) {
	run := func(drainer string, empty float64, evictions, refused int) *drainRun {
		return &drainRun{Drainer: drainer, Empty: secs(empty), Evictions: evictions, TooMany: refused, MaxUnavailable: 1, MaxInFlight: 1,
			Wakeups: []time.Duration{time.Millisecond, 5 * time.Second}}
	}
	d := &drainResult{Profile: "pod-fast", PodsPerNode: 50, Chain: 10,
		Bound:     bench.Bound{Chain: secs(0.4), Throughput: secs(4)},
		Kubectl:   bench.SpreadOf([]time.Duration{secs(8), secs(9), secs(10)}),
		Nodeguard: bench.SpreadOf([]time.Duration{secs(4.2), secs(4.4), secs(4.6)}),
		Runs:      []*drainRun{run("kubectl", 8, 50, 5), run("nodeguard", 4.4, 50, 0)},
	}
	rows := summaryRows(&results{Drain: []*drainResult{d}})
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.key)
	}
	if got := strings.Join(keys, " "); got != "drain/pod-fast wakeup/pod-fast" {
		t.Fatalf("rows %q, want drain/pod-fast and wakeup/pod-fast alone", got)
	}
	for _, want := range []string{"4.40 s (4.20–4.60 s) against 9.00 s (8.00–10.0 s): 2.0× faster", "**1.10× the lower bound** of 4.00 s, set by the throughput term",
		"kubectl 2.25×", "evictions refused (429): 0 of 50 against 5 of 50"} {
		if !strings.Contains(rows[0].result, want) {
			t.Errorf("drain row %q lacks %q", rows[0].result, want)
		}
	}
	md := rows[0].markdown()
	if !strings.HasPrefix(md, "| <!-- bench:row drain/pod-fast --> Drain a node with 50 pods") || strings.Count(md, " | ") != 2 {
		t.Errorf("row markdown %q: want the key in the first of three cells", md)
	}
}

const doc = `# Performance

Prose before.

<!-- bench:summary:begin -->
| | comparator | result |
|---|---|---|
| <!-- bench:row drain/pod-fast --> Drain | kubectl | hand-written drain |
| <!-- bench:row replace --> Replace | kubectl | hand-written replace |
| <!-- bench:row rolling --> Rolling | script | hand-written rolling |
<!-- bench:summary:end -->

Prose after.
`

// TestRewriteSummaryReplacesOnlyTheRowsWithData: the replace row is
// rewritten in place, the rows of sections that did not run are kept, and
// the prose outside the markers is untouched.
func TestRewriteSummaryReplacesOnlyTheRowsWithData(t *testing.T) {
	rows := summaryRows(replaceResults())
	got, kept, err := rewriteSummary(doc, rows)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(doc, "| <!-- bench:row replace --> Replace | kubectl | hand-written replace |", rows[0].markdown(), 1)
	if got != want {
		t.Errorf("rewrote\n%s\nwant\n%s", got, want)
	}
	if strings.Join(kept, " ") != "drain/pod-fast rolling" {
		t.Errorf("kept %q, want drain/pod-fast and rolling", kept)
	}
	if !strings.Contains(rows[0].result, "10.6 s") || !strings.Contains(rows[0].result, "gave up after 300.9 s and 60 refused evictions") {
		t.Errorf("replace row %q lacks nodeguard's time or kubectl's outcome", rows[0].result)
	}
}

// TestRewriteSummaryAppendsANewRow: a row the table lacks goes at its end,
// inside the markers.
func TestRewriteSummaryAppendsANewRow(t *testing.T) {
	without := strings.Replace(doc, "| <!-- bench:row replace --> Replace | kubectl | hand-written replace |\n", "", 1)
	rows := summaryRows(replaceResults())
	got, _, err := rewriteSummary(without, rows)
	if err != nil {
		t.Fatal(err)
	}
	if want := "hand-written rolling |\n" + rows[0].markdown() + "\n" + summaryEnd; !strings.Contains(got, want) {
		t.Errorf("rewrote\n%s\nwant the new row last in the table", got)
	}
}

// TestRewriteSummaryNeedsItsMarkers: a doc without the markers, with them
// reversed or with a row twice is an error, not a guess.
func TestRewriteSummaryNeedsItsMarkers(t *testing.T) {
	rows := summaryRows(replaceResults())
	for name, bad := range map[string]string{
		"no markers": strings.NewReplacer(summaryBegin, "", summaryEnd, "").Replace(doc),
		"no end":     strings.Replace(doc, summaryEnd, "", 1),
		"reversed":   strings.NewReplacer(summaryBegin, summaryEnd, summaryEnd, summaryBegin).Replace(doc),
		"twice":      doc + summaryBegin + "\n" + summaryEnd + "\n",
		"row twice":  strings.Replace(doc, "<!-- bench:row rolling -->", "<!-- bench:row replace -->", 1),
	} {
		if _, _, err := rewriteSummary(bad, rows); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestUpdateDocsRefusesASmokeRunOrAFailedSection: a --quick run, or one
// with a failed section, leaves the doc as it was; a good run rewrites it.
func TestUpdateDocsRefusesASmokeRunOrAFailedSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "performance.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	res := replaceResults()
	res.Config["quick"] = true
	if err := updateDocs(path, res); err == nil {
		t.Error("a --quick run went into the doc")
	}
	res.Config["quick"] = false
	res.Errors = []string{"rolling: timed out"}
	if err := updateDocs(path, res); err == nil {
		t.Error("a run with a failed section went into the doc")
	}
	if raw, _ := os.ReadFile(path); string(raw) != doc {
		t.Fatalf("a refused run changed the doc:\n%s", raw)
	}
	res.Errors = nil
	if err := updateDocs(path, res); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "hand-written replace") || !strings.Contains(string(raw), "hand-written rolling") {
		t.Errorf("doc after the update:\n%s", raw)
	}
}

// TestMemoryRowExtrapolatesOnlyAtFleetSize: the memory row gives nodeguard's
// idle RSS against kube-controller-manager's, and its extrapolation to 5,000
// nodes only from a run of 1,000 nodes or more.
func TestMemoryRowExtrapolatesOnlyAtFleetSize(t *testing.T) {
	const mi = 1 << 20
	scale := func(nodes int) *scaleResult {
		pods := 20 * nodes
		return &scaleResult{Nodes: nodes, Pods: pods, Deleted: nodes / 20, Parallel: 10,
			Idle: []idlePoint{{Nodes: nodes / 10, Pods: pods / 10, RSS: 70 * mi}, {Nodes: nodes, Pods: pods, RSS: 88 * mi}},
			Phases: []scalePhase{
				{Name: idlePhase(nodes, pods), RSS: map[string]int64{"nodeguard": 88 * mi, "kube-controller-manager": 176 * mi}},
				{Name: nodeguardDeletionPhase(nodes / 20), RSS: map[string]int64{"nodeguard": 100 * mi, "kube-controller-manager": 200 * mi}},
			}}
	}
	small, large := scaleRows(scale(200)), scaleRows(scale(2000))
	if len(small) != 1 || len(large) != 1 || small[0].key != "memory/200" || large[0].key != "memory/2000" {
		t.Fatalf("rows %+v and %+v, want a memory row each (no fleet deletion ran)", small, large)
	}
	if want := "88 MiB idle (0.50× of KCM); at most 100 MiB (0.50×) while it deletes 10 nodes"; !strings.HasPrefix(small[0].result, want) {
		t.Errorf("memory row %q, want it to start %q", small[0].result, want)
	}
	if strings.Contains(small[0].result, "extrapolated") {
		t.Errorf("a 200-node run extrapolated: %q", small[0].result)
	}
	// 18 MiB over 1,800 nodes: 10 MiB per 1,000, 88 + 30 at 5,000.
	if want := "grows 10 MiB per 1,000 nodes: 118 MiB extrapolated to 5,000 nodes and 100,000 pods"; !strings.Contains(large[0].result, want) {
		t.Errorf("memory row %q lacks %q", large[0].result, want)
	}
}
