// Package bench holds the pure helpers of `make bench` (percentiles, the
// drain lower bound, the results table and the SVG timeline plot). The
// benchmark itself, which starts local control planes, is bench/cmd/bench.
//
// Every figure the benchmark reports is a ratio or a count measured in the
// same run, nodeguard beside a comparator: the machine is shared and noisy, so
// absolute times are context, never a pass/fail criterion.
package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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

// Mean is the samples' arithmetic mean, and StdErr the standard error of
// that mean (the sample's standard deviation ÷ √n; zero below two samples).
// The chain term uses the mean, not the median: a chain's expected time is
// the sum of its cycles' expected times, and a random cycle's median can sit
// far from its mean.
func Mean(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	var sum float64
	for _, d := range samples {
		sum += float64(d)
	}
	return time.Duration(sum / float64(len(samples)))
}

func StdErr(samples []time.Duration) time.Duration {
	n := len(samples)
	if n < 2 {
		return 0
	}
	mean := float64(Mean(samples))
	var ss float64
	for _, d := range samples {
		ss += (float64(d) - mean) * (float64(d) - mean)
	}
	return time.Duration(math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n)))
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

// ChainTerm is the least time the budgets alone let any drainer take: the
// longest chain of sequential rounds (chains are the chain lengths of the
// node's PDBs), less its first round, times one budget cycle, eviction
// request to the PDB allowing again, as the cluster does it with nothing
// else to do. The first round waits for no cycle, and the node is empty
// once the last round's pods go, before their replacements: n rounds wait
// n-1 cycles.
func ChainTerm(chains []int, cycle time.Duration) time.Duration {
	longest := 0
	for _, c := range chains {
		longest = max(longest, c)
	}
	return time.Duration(max(longest-1, 0)) * cycle
}

// LongestOfChains estimates when the last of a node's chains of PDB
// evictions ends, as a drain waits for them all at once: each of chains
// chains waits cycles cycles, and the cycles vary. Each of draws trials sums
// cycles cycles drawn (with replacement) from the measured ones per chain and
// keeps the longest chain; the estimate is their mean. ChainTerm is one
// chain's expected time: with cycles that vary, the longest of several
// chains is expected later. The seed is fixed: the same samples give the same
// estimate.
func LongestOfChains(chains, cycles int, measured []time.Duration, draws int) time.Duration {
	if chains <= 0 || cycles <= 0 || len(measured) == 0 || draws <= 0 {
		return 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var total time.Duration
	for range draws {
		var longest time.Duration
		for range chains {
			var chain time.Duration
			for range cycles {
				chain += measured[rng.IntN(len(measured))]
			}
			longest = max(longest, chain)
		}
		total += longest
	}
	return total / time.Duration(draws)
}

// Gating is how many of a PodDisruptionBudget's pods on a node must be
// replaced, and their replacements Ready, before its last pod on the node can
// be evicted: every eviction beyond the first `allowed` waits for one.
func Gating(pods, allowed int) int {
	if allowed <= 0 {
		return 0
	}
	return max(pods-allowed, 0)
}

// ThroughputTerm is the least time a client limited to qps requests a second,
// with a token bucket of burst that starts full, needs for writesPerPod
// writes for each of pods replacements: the first burst writes go at once,
// the rest at qps a second.
func ThroughputTerm(writesPerPod float64, pods, qps, burst int) time.Duration {
	if qps <= 0 {
		return 0
	}
	rest := writesPerPod*float64(pods) - float64(burst)
	if rest <= 0 {
		return 0
	}
	return time.Duration(rest / float64(qps) * float64(time.Second))
}

// Bound is the drain's lower bound: whichever of its two terms is longer.
type Bound struct {
	Chain      time.Duration `json:"chainTerm"`
	Throughput time.Duration `json:"throughputTerm"`
}

// Value is the bound itself, max(chain term, throughput term).
func (b Bound) Value() time.Duration { return max(b.Chain, b.Throughput) }

// Binds names the term that sets the bound ("chain" on a tie).
func (b Bound) Binds() string {
	if b.Throughput > b.Chain {
		return "throughput"
	}
	return "chain"
}

// Spread is a small sample's median and range, for repeated runs.
type Spread struct {
	N      int           `json:"n"`
	Median time.Duration `json:"median"`
	Min    time.Duration `json:"min"`
	Max    time.Duration `json:"max"`
}

// SpreadOf returns the sample's size, median (the lower middle of an even
// count: a time one of the runs took) and range.
func SpreadOf(samples []time.Duration) Spread {
	if len(samples) == 0 {
		return Spread{}
	}
	return Spread{N: len(samples), Median: Percentile(samples, 50), Min: slices.Min(samples), Max: slices.Max(samples)}
}

// String formats the spread as "6.87 s (6.50–7.20 s)".
func (s Spread) String() string {
	if s.N == 0 {
		return "none"
	}
	return fmt.Sprintf("%s (%s–%s)", Seconds(s.Median), strings.TrimSuffix(Seconds(s.Min), " s"), Seconds(s.Max))
}
