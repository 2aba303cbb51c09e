package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

// passCounter counts nodeguard's termination passes from its own metrics:
// every pass is one reconcile of the termination controller
// (controller_runtime_reconcile_total{controller="termination"}), which
// reconciles only the nodes it terminates. A draining node's pass reads the
// node from the cache and its pods from a watch, so no request per pass
// shows at the API server.
type passCounter struct {
	t    *testing.T
	port int
}

// startNodeguardCountingPasses is startNodeguard with its metrics served
// for a passCounter.
func startNodeguardCountingPasses(t *testing.T, kubeconfig string, emu *armemulator.Server, extra ...string) (*harness.Nodeguard, *passCounter) {
	t.Helper()
	port := harness.FreePort(t)
	ng := startNodeguard(t, kubeconfig, emu, append([]string{fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port), "--metrics-secure=false"}, extra...)...)
	return ng, &passCounter{t: t, port: port}
}

// of counts the passes so far, all of node's: it fails the test if nodeguard
// terminates another node too (nodeguard_termination_nodes), whose passes
// the count would include.
func (p *passCounter) of(node string) int {
	p.t.Helper()
	if n := scrapeSum(p.t, p.port, "nodeguard_termination_nodes", ""); n > 1 {
		p.t.Fatalf("nodeguard terminates %v nodes: its passes are not all of %s", n, node)
	}
	return int(scrapeSum(p.t, p.port, "controller_runtime_reconcile_total", `controller="termination"`))
}

// settled waits until no termination pass runs, so that of counts the last
// one too (a pass is counted when it returns).
func (p *passCounter) settled() {
	p.t.Helper()
	harness.Eventually(p.t, 30*time.Second, func(context.Context) (bool, error) {
		return scrapeSum(p.t, p.port, "controller_runtime_active_workers", `controller="termination"`) == 0, nil
	}, "no termination pass runs")
}

// scrapeCounter reads one series of nodeguard's /metrics.
func scrapeCounter(t *testing.T, port int, series string) float64 {
	t.Helper()
	var v float64
	scrape(t, port, func(line string) {
		if s, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ = strconv.ParseFloat(s, 64)
		}
	})
	return v
}

// scrapeSum adds up the series of a metric of nodeguard's /metrics whose
// labels include label ("" for all).
func scrapeSum(t *testing.T, port int, metric, label string) float64 {
	t.Helper()
	var sum float64
	scrape(t, port, func(line string) {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			return
		}
		labels, value := "", rest
		if end := strings.LastIndex(rest, "} "); strings.HasPrefix(rest, "{") && end > 0 {
			labels, value = rest[:end+1], rest[end+1:]
		}
		if !strings.Contains(labels, label) {
			return
		}
		f, _ := strconv.ParseFloat(strings.TrimSpace(value), 64)
		sum += f
	})
	return sum
}

// scrape hands each line of nodeguard's /metrics to line.
func scrape(t *testing.T, port int, line func(string)) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
