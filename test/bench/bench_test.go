package bench

import (
	"bytes"
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentile(t *testing.T) {
	var hundred []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, ms(i))
	}
	tests := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", []time.Duration{ms(7)}, 99, ms(7)},
		{"p50 of 1..100", hundred, 50, ms(50)},
		{"p99 of 1..100", hundred, 99, ms(99)},
		{"p100 is the max", hundred, 100, ms(100)},
		{"nearest rank rounds up", []time.Duration{ms(1), ms(2), ms(3)}, 50, ms(2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.samples, tt.p); got != tt.want {
				t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
	if hundred[0] != ms(100) {
		t.Error("Percentile sorted its input in place")
	}
}

func TestMeanAndStdErr(t *testing.T) {
	// Skewed like pod-general's idle cycles: the median (3 s) is far from
	// the mean (4 s), which a chain of such cycles sums to on average.
	samples := []time.Duration{ms(2000), ms(3000), ms(3000), ms(4000), ms(8000)}
	if got := Mean(samples); got != ms(4000) {
		t.Errorf("Mean = %v, want 4s", got)
	}
	// Sample standard deviation √(22/4) s ≈ 2.345 s, ÷ √5 ≈ 1.049 s.
	if got := StdErr(samples); got < ms(1048) || got > ms(1049) {
		t.Errorf("StdErr = %v, want about 1.0488s", got)
	}
	if Mean(nil) != 0 || StdErr([]time.Duration{ms(5)}) != 0 {
		t.Error("no samples have no mean, and one has no standard error")
	}
}

func TestChainTerm(t *testing.T) {
	tests := []struct {
		name        string
		pods, allow []int
		cycle       time.Duration
		want        time.Duration
	}{
		{"four PDBs of 10 under maxUnavailable 1: 10 rounds wait 9 cycles", []int{10, 10, 10, 10}, []int{1, 1, 1, 1}, ms(500), 4500 * time.Millisecond},
		{"the longest chain wins", []int{10, 4}, []int{5, 1}, time.Second, 3 * time.Second},
		{"a partial round counts", []int{5}, []int{2}, time.Second, 2 * time.Second},
		{"one round waits for no cycle", []int{3}, []int{3}, time.Second, 0},
		{"no pods", nil, nil, time.Second, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chains []int
			for i := range tt.pods {
				chains = append(chains, ChainLength(tt.pods[i], tt.allow[i]))
			}
			if got := ChainTerm(chains, tt.cycle); got != tt.want {
				t.Errorf("ChainTerm = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLongestOfChains: with cycles of 1 s or 3 s, equally likely, a chain of 9
// cycles lasts 9 s + 2 s × B, B binomial (9, 1/2); the longest of 4 such
// chains has the exact mean sum over k of P(max > k). The estimate lands
// within 1% of it, above one chain's 18 s; with cycles that do not vary, it is
// exactly the cycles' sum, as ChainTerm.
func TestLongestOfChains(t *testing.T) {
	if got := LongestOfChains(4, 9, []time.Duration{ms(500), ms(500)}, 100); got != 4500*time.Millisecond {
		t.Errorf("constant cycles: %v, want 4.5s", got)
	}
	binom := make([]float64, 10) // P(B = b)
	for b := range binom {
		binom[b] = float64(choose(9, b)) / 512
	}
	var exact float64 // E[max] = 9 + 2 × sum over b of P(max B > b)
	cdf := 0.0
	for b := range 9 {
		cdf += binom[b]
		exact += 1 - math.Pow(cdf, 4)
	}
	want := time.Duration((9 + 2*exact) * float64(time.Second))
	got := LongestOfChains(4, 9, []time.Duration{time.Second, 3 * time.Second}, 20000)
	if math.Abs(float64(got-want)) > 0.01*float64(want) {
		t.Errorf("the longest of 4 chains: %v, want %v within 1%%", got, want)
	}
	if one := LongestOfChains(1, 9, []time.Duration{time.Second, 3 * time.Second}, 20000); math.Abs(float64(one-18*time.Second)) > 0.01*float64(18*time.Second) || got <= one {
		t.Errorf("one chain: %v, want 18s within 1%%, and below the longest of 4 (%v)", one, got)
	}
	if LongestOfChains(4, 0, []time.Duration{time.Second}, 10) != 0 || LongestOfChains(4, 9, nil, 10) != 0 {
		t.Error("no cycles to wait, or none measured, estimate 0")
	}
}

func choose(n, k int) int {
	c := 1
	for i := range k {
		c = c * (n - i) / (i + 1)
	}
	return c
}

func TestGating(t *testing.T) {
	tests := []struct{ pods, allowed, want int }{
		{10, 1, 9},
		{10, 2, 8},
		{5, 2, 3},
		{1, 1, 0},
		{3, 5, 0},
		{4, 0, 0}, // never drains: no replacement helps
	}
	for _, tt := range tests {
		if got := Gating(tt.pods, tt.allowed); got != tt.want {
			t.Errorf("Gating(%d pods, %d allowed) = %d, want %d", tt.pods, tt.allowed, got, tt.want)
		}
	}
}

func TestThroughputTerm(t *testing.T) {
	tests := []struct {
		name         string
		writesPerPod float64
		pods         int
		want         time.Duration
	}{
		// 20/s with a burst of 30: kube-controller-manager's client defaults.
		{"the burst goes at once, the rest at the limit", 3.2, 50, 6500 * time.Millisecond},
		{"within the burst", 0.5, 50, 0},
		{"exactly the burst", 1, 30, 0},
		{"no pods", 3, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ThroughputTerm(tt.writesPerPod, tt.pods, 20, 30); got != tt.want {
				t.Errorf("ThroughputTerm(%v, %d) = %v, want %v", tt.writesPerPod, tt.pods, got, tt.want)
			}
		})
	}
	if got := ThroughputTerm(3, 50, 0, 30); got != 0 {
		t.Errorf("ThroughputTerm with no limit = %v, want 0", got)
	}
}

func TestBoundIsTheLongerTerm(t *testing.T) {
	tests := []struct {
		b     Bound
		value time.Duration
		binds string
	}{
		{Bound{Chain: 4 * time.Second, Throughput: 6 * time.Second}, 6 * time.Second, "throughput"},
		{Bound{Chain: 50 * time.Second, Throughput: 6 * time.Second}, 50 * time.Second, "chain"},
		{Bound{Chain: time.Second, Throughput: time.Second}, time.Second, "chain"},
	}
	for _, tt := range tests {
		if got := tt.b.Value(); got != tt.value {
			t.Errorf("%+v.Value() = %v, want %v", tt.b, got, tt.value)
		}
		if got := tt.b.Binds(); got != tt.binds {
			t.Errorf("%+v.Binds() = %q, want %q", tt.b, got, tt.binds)
		}
	}
}

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		name    string
		samples []time.Duration
		want    Spread
		text    string
	}{
		{"none", nil, Spread{}, "none"},
		{"three runs, unsorted", []time.Duration{ms(7200), ms(6500), ms(6870)}, Spread{N: 3, Median: ms(6870), Min: ms(6500), Max: ms(7200)}, "6.87 s (6.50–7.20 s)"},
		{"an even count takes the lower middle", []time.Duration{ms(4000), ms(1000), ms(3000), ms(2000)}, Spread{N: 4, Median: ms(2000), Min: ms(1000), Max: ms(4000)}, "2.00 s (1.00–4.00 s)"},
		{"one run", []time.Duration{ms(60500)}, Spread{N: 1, Median: ms(60500), Min: ms(60500), Max: ms(60500)}, "60.5 s (60.5–60.5 s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SpreadOf(tt.samples)
			if got != tt.want {
				t.Errorf("SpreadOf = %+v, want %+v", got, tt.want)
			}
			if got.String() != tt.text {
				t.Errorf("String() = %q, want %q", got.String(), tt.text)
			}
		})
	}
}

func TestWriteTimelineSVG(t *testing.T) {
	panels := []Panel{{
		Title: "pod-fast <&>", YLabel: "pods on node",
		Series: []Series{
			{Name: "kubectl drain", Color: "#d62728", Points: []Point{{0, 50}, {ms(5000), 40}, {ms(50000), 0}}},
			{Name: "nodeguard", Color: "#1f77b4", Points: []Point{{0, 50}, {ms(3000), 0}}},
		},
		Marker: ms(2000), MarkerLabel: "lower bound",
	}, {Title: "empty"}}
	var buf bytes.Buffer
	if err := WriteTimelineSVG(&buf, "drain timelines", panels); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with one polyline per non-empty series.
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	polylines := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 2 {
		t.Errorf("%d polylines, want 2", polylines)
	}
	for _, want := range []string{"kubectl drain", "nodeguard", "lower bound", "pod-fast &lt;&amp;&gt;"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestTableMarkdown(t *testing.T) {
	tb := Table{Title: "Drain", Header: []string{"profile", "ratio"}}
	tb.AddRow("pod-fast", Times(3.456))
	tb.Note("lower bound %s", Seconds(1500*time.Millisecond))
	var buf bytes.Buffer
	tb.WriteMarkdown(&buf)
	want := "### Drain\n\n| profile | ratio |\n|---|---|\n| pod-fast | 3.46× |\n\n- lower bound 1.50 s\n\n"
	if buf.String() != want {
		t.Errorf("markdown:\n%q\nwant\n%q", buf.String(), want)
	}
}
