package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// histogram is one Prometheus histogram as nodeguard's /metrics shows it:
// cumulative counts by finite upper bound, and the count of every
// observation (the +Inf bucket, which JSON cannot hold as a bound).
type histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []float64 `json:"counts"` // cumulative, by bound
	Total  float64   `json:"count"`
}

// since is the histogram of the observations made after before.
func (h histogram) since(before histogram) histogram {
	out := histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts), Total: h.Total - before.Total}
	if len(before.Counts) == len(h.Counts) {
		for i := range out.Counts {
			out.Counts[i] -= before.Counts[i]
		}
	}
	return out
}

func (h histogram) count() int { return int(h.Total) }

// quantile is the upper bound of the bucket that holds the q-quantile: the
// q-quantile is at most that (+Inf past the last bound).
func (h histogram) quantile(q float64) float64 {
	n := h.Total
	for i, c := range h.Counts {
		if n > 0 && c >= q*n {
			return h.Bounds[i]
		}
	}
	return math.Inf(1)
}

// summary says "p50 ≤ 4 ms, p99 ≤ 16 ms (n 90)" for the histogram.
func (h histogram) summary() string {
	if h.count() == 0 {
		return "no observations"
	}
	ms := func(s float64) string {
		if math.IsInf(s, 1) {
			return "more than the last bucket"
		}
		return fmt.Sprintf("%g ms", s*1000)
	}
	return fmt.Sprintf("p50 ≤ %s, p99 ≤ %s (n %d)", ms(h.quantile(0.5)), ms(h.quantile(0.99)), h.count())
}

// scrapeHistograms reads the named histograms from a Prometheus text
// endpoint. A name may pick one series by its labels, as
// `name{label="value"}` (the labels as the endpoint writes them, before le).
func scrapeHistograms(ctx context.Context, url string, names ...string) (map[string]histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]histogram{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range names {
			prefix := name + `_bucket{le="`
			if base, labels, ok := strings.Cut(name, "{"); ok {
				prefix = base + `_bucket{` + strings.TrimSuffix(labels, "}") + `,le="`
			}
			if !strings.HasPrefix(line, prefix) {
				continue
			}
			le, value, ok := strings.Cut(strings.TrimPrefix(line, prefix), `"} `)
			if !ok {
				continue
			}
			bound, err1 := strconv.ParseFloat(le, 64)
			count, err2 := strconv.ParseFloat(strings.Fields(value)[0], 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("reading %q: %v %v", line, err1, err2)
			}
			h := out[name]
			if math.IsInf(bound, 1) {
				h.Total = count
			} else {
				h.Bounds, h.Counts = append(h.Bounds, bound), append(h.Counts, count)
			}
			out[name] = h
		}
	}
	return out, sc.Err()
}

// scrapeCounter reads the sum of a counter's series from a Prometheus text
// endpoint (0 when it has none yet).
func scrapeCounter(ctx context.Context, url, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("reading %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// freeAddr is a local address no one listens on (for a moment).
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
