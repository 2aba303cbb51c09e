package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestHistogramsFromMetrics: the buckets of a histogram are read from the
// Prometheus text format, a later scrape less an earlier one is the
// observations in between, a quantile is the bound of its bucket, and the
// histogram goes into results.json (no +Inf bound).
func TestHistogramsFromMetrics(t *testing.T) {
	counts := [][4]int{{1, 1, 1, 1}, {1, 5, 9, 11}}
	scrape := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c := counts[scrape]
		scrape++
		fmt.Fprintf(w, "# TYPE h histogram\nh_bucket{le=\"0.001\"} %d\nh_bucket{le=\"0.002\"} %d\nh_bucket{le=\"0.004\"} %d\nh_bucket{le=\"+Inf\"} %d\nh_sum 1\nh_count %d\nother_bucket{le=\"1\"} 7\n", c[0], c[1], c[2], c[3], c[3])
	}))
	defer srv.Close()
	before, err := scrapeHistograms(context.Background(), srv.URL, "h")
	if err != nil {
		t.Fatal(err)
	}
	after, err := scrapeHistograms(context.Background(), srv.URL, "h")
	if err != nil {
		t.Fatal(err)
	}
	h := after["h"].since(before["h"])
	if h.count() != 10 {
		t.Fatalf("%d observations in between, want 10", h.count())
	}
	if got := h.summary(); got != "p50 ≤ 4 ms, p99 ≤ more than the last bucket (n 10)" {
		t.Errorf("summary %q", got)
	}
	if _, err := json.Marshal(h); err != nil {
		t.Errorf("the histogram does not go into results.json: %v", err)
	}
}

// TestLabelledHistogramAndCounter: a histogram series is picked by its
// labels (the le label last, as client_golang writes it), and a counter is
// the sum of its series.
func TestLabelledHistogramAndCounter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `w_bucket{webhook="/a",le="0.005"} 3
w_bucket{webhook="/a",le="+Inf"} 4
w_bucket{webhook="/b",le="0.005"} 9
w_bucket{webhook="/b",le="+Inf"} 9
dropped_total{reason="queue_full"} 2
dropped_total{reason="stopped"} 1
dropped_totally 40
`)
	}))
	defer srv.Close()
	hs, err := scrapeHistograms(context.Background(), srv.URL, `w{webhook="/a"}`)
	if err != nil {
		t.Fatal(err)
	}
	if h := hs[`w{webhook="/a"}`]; h.count() != 4 || len(h.Counts) != 1 || h.Counts[0] != 3 {
		t.Errorf("the /a series read as %+v, want 3 of 4 within 5 ms", h)
	}
	if n, err := scrapeCounter(context.Background(), srv.URL, "dropped_total"); err != nil || n != 3 {
		t.Errorf("counter %v (%v), want 3", n, err)
	}
}
