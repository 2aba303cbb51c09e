package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSplitEvenly: nodes whose Deployment pods cluster (many on a few
// nodes, a Deployment's pods together; taking every other node would give
// one set all of web-0) are dealt into two sets of the same size whose
// Deployment pods match within a pod either way in all, and within a node's
// worth Deployment by Deployment.
func TestSplitEvenly(t *testing.T) {
	var loads []nodeLoad
	for i := range 20 {
		apps := map[string]int{}
		switch {
		case i%2 == 0 && i < 10: // the even nodes at the front carry web-0
			apps["web-0"] = 6
		case i < 10:
			apps["web-1"] = 2
		default:
			apps[fmt.Sprintf("web-%d", i%3+1)] = 1
		}
		loads = append(loads, nodeLoad{name: fmt.Sprintf("n%02d", i), apps: apps})
	}
	a, b := splitEvenly(loads, 10)
	if len(a) != 10 || len(b) != 10 {
		t.Fatalf("sets of %d and %d nodes, want 10 and 10", len(a), len(b))
	}
	byName := map[string]nodeLoad{}
	for _, l := range loads {
		byName[l.name] = l
	}
	sum := func(set []string) (int, map[string]int) {
		total, apps := 0, map[string]int{}
		for _, n := range set {
			for app, v := range byName[n].apps {
				apps[app] += v
				total += v
			}
		}
		return total, apps
	}
	ta, appsA := sum(a)
	tb, appsB := sum(b)
	if abs(ta-tb) > 2 {
		t.Errorf("Deployment pods %d against %d, want at most 2 apart", ta, tb)
	}
	for _, app := range []string{"web-0", "web-1", "web-2", "web-3"} {
		if d := abs(appsA[app] - appsB[app]); d > 6 {
			t.Errorf("%s: %d against %d pods, want at most one node's worth (6) apart", app, appsA[app], appsB[app])
		}
	}
	seen := map[string]bool{}
	for _, n := range append(append([]string{}, a...), b...) {
		if seen[n] {
			t.Errorf("%s dealt twice", n)
		}
		seen[n] = true
	}
}

// TestIdlePointIsTheMedianOfItsSamples: an idle window's RSS is the median of
// its samples, so that one sample the collector's pacing put high does not
// set the slope; with too few samples it is the peak.
func TestIdlePointIsTheMedianOfItsSamples(t *testing.T) {
	const mb = 1 << 20
	p := newIdlePoint(200, 4000, []int64{70 * mb, 96 * mb, 71 * mb, 69 * mb, 72 * mb}, 96*mb)
	if p.RSS != 71*mb || p.Peak != 96*mb {
		t.Errorf("median %d MiB, peak %d MiB; want 71 and 96", p.RSS/mb, p.Peak/mb)
	}
	if q := newIdlePoint(200, 4000, []int64{70 * mb, 96 * mb}, 96*mb); q.RSS != 96*mb {
		t.Errorf("two samples gave %d MiB; want the peak, 96", q.RSS/mb)
	}
	r := &scaleResult{Idle: []idlePoint{
		newIdlePoint(200, 4000, []int64{60 * mb, 61 * mb, 90 * mb}, 90*mb),
		newIdlePoint(2000, 40000, []int64{80 * mb, 79 * mb, 81 * mb}, 81*mb),
	}}
	want := float64(19*mb) / 1.8 // 61 to 80 MiB over 1,800 nodes
	if slope, _ := r.rssPerThousandNodes(); slope < want-1 || slope > want+1 {
		t.Errorf("slope %.2f MiB per 1,000 nodes; want %.2f", slope/mb, want/mb)
	}
}

// TestFleetBound: the chain term is the Deployment with the most rounds in
// the set (its rounds less one, × the mean idle cycle), the throughput term
// the gating replacements at the fewer writes per pod, the eviction term the
// set's pods at the fastest probe's rate, and the bound the largest.
func TestFleetBound(t *testing.T) {
	b := &fleetBound{
		Cycles:       []time.Duration{time.Second, 3 * time.Second},
		WritesPerPod: map[string]float64{"nodeguard": 3.0, "kubectl": 3.5},
	}
	b.compute(map[string]int{"web-0": 28, "web-1": 5, "web-2": 12}, 200)
	if b.Longest != "web-0" || b.LongestRounds != 3 || b.Gating != 20 {
		t.Errorf("longest %s with %d rounds, %d gating; want web-0, 3 rounds (28 pods, 10 at a time), 20 gating (18 + 2)", b.Longest, b.LongestRounds, b.Gating)
	}
	if b.Chain != 4*time.Second { // 2 cycles of 2 s
		t.Errorf("chain term %s, want 4s", b.Chain)
	}
	if b.Throughput != 1500*time.Millisecond { // 3.0 × 20 − 30 = 30 writes at 20/s
		t.Errorf("throughput term %s, want 1.5s", b.Throughput)
	}
	if b.Eviction != 0 || b.value() != 4*time.Second || b.binds() != "chain" {
		t.Errorf("no probe: eviction term %s, bound %s set by %s; want none, 4s by the chain", b.Eviction, b.value(), b.binds())
	}
	b.EvictionRates = []float64{20, 40, 25}
	b.compute(map[string]int{"web-0": 28, "web-1": 5, "web-2": 12}, 200)
	if b.Eviction != 5*time.Second || b.value() != 5*time.Second || b.binds() != "eviction" { // 200 pods at 40/s
		t.Errorf("eviction term %s, bound %s set by %s; want 5s by the eviction term", b.Eviction, b.value(), b.binds())
	}
	if b.twoTerms() != 4*time.Second {
		t.Errorf("the issue's two-term bound %s, want 4s", b.twoTerms())
	}
}

// TestBudgetsWhole: a fleet run starts only when no Deployment is already
// past its PDB's budget; a few stale pods within it are tolerated.
func TestBudgetsWhole(t *testing.T) {
	if err := budgetsWhole(map[string]int32{"web-0": scaleReplicas, "web-1": scaleReplicas - scaleBudget + 1}); err != nil {
		t.Errorf("a Deployment within its budget: %v", err)
	}
	err := budgetsWhole(map[string]int32{"web-0": scaleReplicas, "web-12": scaleReplicas - 14, "web-9": scaleReplicas - scaleBudget})
	if err == nil {
		t.Fatal("two Deployments at or past their budget: no error")
	}
	for _, want := range []string{"web-12 (14 of 100 unavailable)", "web-9 (10 of 100 unavailable)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "web-0") {
		t.Errorf("error %q names web-0, which is whole", err)
	}
}
