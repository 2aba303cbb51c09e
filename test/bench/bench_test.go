package bench

import (
	"bytes"
	"encoding/xml"
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

func TestDips(t *testing.T) {
	pts := []Point{{0, 10}, {ms(100), 9}, {ms(150), 9}, {ms(400), 10}, {ms(500), 9}, {ms(900), 10}, {ms(1000), 9}}
	got := Dips(pts, 10)
	want := []time.Duration{ms(300), ms(400)} // the last dip is still open
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Dips = %v, want %v", got, want)
	}
}

func TestLowerBound(t *testing.T) {
	tests := []struct {
		name        string
		pods, allow []int
		cycle       time.Duration
		want        time.Duration
	}{
		{"four PDBs of 10 under maxUnavailable 1", []int{10, 10, 10, 10}, []int{1, 1, 1, 1}, ms(500), 5 * time.Second},
		{"the longest chain wins", []int{10, 4}, []int{5, 1}, time.Second, 4 * time.Second},
		{"a partial round counts", []int{5}, []int{2}, time.Second, 3 * time.Second},
		{"no pods", nil, nil, time.Second, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chains []int
			for i := range tt.pods {
				chains = append(chains, ChainLength(tt.pods[i], tt.allow[i]))
			}
			if got := LowerBound(chains, tt.cycle); got != tt.want {
				t.Errorf("LowerBound = %v, want %v", got, tt.want)
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
