// Package bench holds the pure helpers of `make bench` (percentiles, the
// drain lower bound, the results table and the SVG timeline plot). The
// benchmark itself, which starts local control planes, is bench/cmd/bench.
//
// Every figure the benchmark reports is a ratio or a count measured in the
// same run, nodeguard beside a comparator: the machine is shared and noisy, so
// absolute times are context, never a pass/fail criterion.
package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// samples, which need not be sorted; zero for no samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Summary describes a latency sample.
type Summary struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

// Summarize returns the sample's size, p50, p99 and maximum.
func Summarize(samples []time.Duration) Summary {
	return Summary{N: len(samples), P50: Percentile(samples, 50), P99: Percentile(samples, 99), Max: Percentile(samples, 100)}
}

// Ratio is a/b, or 0 when b is zero.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Point is a value of a step function from time T (since the start of a
// run) on.
type Point struct {
	T time.Duration `json:"t"`
	V int           `json:"v"`
}

// Dips returns, for a step function of a workload's healthy pods, how long
// each dip below full lasted: from the first point below full to the next
// point at full or above. A dip still open at the end is not counted. These
// are the eviction-to-replacement-Ready cycles of a drain under a
// maxUnavailable-1 PodDisruptionBudget.
func Dips(points []Point, full int) []time.Duration {
	var out []time.Duration
	var start time.Duration
	in := false
	for _, p := range points {
		switch {
		case !in && p.V < full:
			in, start = true, p.T
		case in && p.V >= full:
			in = false
			out = append(out, p.T-start)
		}
	}
	return out
}

// ChainLength is how many sequential eviction rounds a PodDisruptionBudget
// that allows `allowed` disruptions at a time needs for `pods` of its pods on
// one node: ceil(pods/allowed).
func ChainLength(pods, allowed int) int {
	if pods <= 0 {
		return 0
	}
	if allowed <= 0 {
		return math.MaxInt
	}
	return (pods + allowed - 1) / allowed
}

// LowerBound is the least time any drainer that respects the budgets needs:
// the longest chain of sequential rounds times one budget cycle (eviction
// request to the PDB allowing again). chains are the chain lengths of the
// node's PDBs.
func LowerBound(chains []int, cycle time.Duration) time.Duration {
	longest := 0
	for _, c := range chains {
		longest = max(longest, c)
	}
	return time.Duration(longest) * cycle
}
