package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"
)

// exportedMetrics returns the names of every metric registered on
// controller-runtime's registry in this binary: nodeguard's own, the Azure
// ones and controller-runtime's and client-go's. Registered vectors are listed
// even before they have a series, unlike a scrape.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	collector, ok := metrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("metrics.Registry (%T) cannot describe its metrics", metrics.Registry)
	}
	descs := make(chan *prometheus.Desc)
	go func() { collector.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// promqlNames are PromQL words that are not metric names.
var promqlNames = []string{"and", "or", "unless", "bool", "offset", "inf", "nan"}

var (
	promqlStrings    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlMatchers   = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges     = regexp.MustCompile(`\[[^\]]*\]`)
	promqlDurations  = regexp.MustCompile(`\b[0-9]+(?:ms|[smhdwy])\b`)
	promqlGrouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdentifier = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\(?)`)
)

// metricNames returns the metric names a PromQL expression selects: the
// identifiers that are not functions, keywords, label names or durations.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlDurations.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promqlIdentifier.FindAllStringSubmatch(s, -1) {
		if m[2] == "(" || slices.Contains(promqlNames, strings.ToLower(m[1])) {
			continue
		}
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

func TestMetricNamesInPromQL(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (phase) (nodeguard_termination_nodes{namespace="$namespace"})`, []string{"nodeguard_termination_nodes"}},
		{`histogram_quantile(0.9, sum by (le, operation) (rate(a_seconds_bucket{x=~"a|b"}[$__rate_interval])))`, []string{"a_seconds_bucket"}},
		{"sum(x) > 0\nand on() sum(increase(y_count[30m])) == 0", []string{"x", "y_count"}},
		{`(sum(z) or vector(0)) < 1`, []string{"z"}},
		{`absent(up{job="nodeguard-metrics-service"} == 1)`, []string{"up"}},
		{`rate(q_total[5m] offset 1h) > bool 0 unless w`, []string{"q_total", "w"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %v, want %v", tt.expr, got, tt.want)
		}
	}
}

// exported tells whether a series name is one the binary exports, counting
// the _bucket, _sum and _count series of histograms and summaries.
// "up" is the one series Prometheus makes itself for every target.
func exported(names map[string]bool, name string) bool {
	if names[name] || name == "up" {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && names[base] {
			return true
		}
	}
	return false
}

// TestDashboardAndAlertsUseOnlyExportedMetrics parses the Grafana dashboard
// and the PrometheusRule, and checks every metric they query is one this
// binary registers.
func TestDashboardAndAlertsUseOnlyExportedMetrics(t *testing.T) {
	names := exportedMetrics(t)
	for _, want := range []string{"nodeguard_termination_nodes", "cloudprovider_azure_lock_wait_duration_seconds", "loadbalancer_adminstate_pool_updates_total", "controller_runtime_webhook_requests_total"} {
		if !names[want] {
			t.Fatalf("the registry does not list %s: is the package that registers it still imported? got %v", want, names)
		}
	}
	exprs := monitoringExprs(t)
	used := 0
	for src, list := range exprs {
		for _, expr := range list {
			found := metricNames(expr)
			if len(found) == 0 {
				t.Errorf("%s: no metric in %q", src, expr)
			}
			for _, name := range found {
				used++
				if !exported(names, name) {
					t.Errorf("%s: %s is not a metric nodeguard exports (expression %q)", src, name, expr)
				}
			}
		}
	}
	t.Logf("%d metric references in %d panels and alerts checked against %d exported metrics", used, len(exprs), len(names))
}

// monitoringExprs returns the PromQL expressions of the Grafana dashboards
// and the PrometheusRule, by source (panel or alert).
func monitoringExprs(t *testing.T) map[string][]string {
	t.Helper()
	root := filepath.Join("..", "..")
	exprs := map[string][]string{} // source -> expressions
	dashboards, _ := filepath.Glob(filepath.Join(root, "manifests", "prometheus", "*.json"))
	if len(dashboards) == 0 {
		t.Fatal("no dashboard under manifests/prometheus/")
	}
	for _, path := range dashboards {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, p := range d.Panels {
			for _, target := range p.Targets {
				src := filepath.Base(path) + ": panel " + p.Title
				exprs[src] = append(exprs[src], target.Expr)
			}
		}
	}
	rulesPath := filepath.Join(root, "manifests", "prometheus", "rules.yaml")
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts++
			exprs["rules.yaml: alert "+r.Alert] = append(exprs["rules.yaml: alert "+r.Alert], r.Expr)
		}
	}
	if alerts < 4 {
		t.Errorf("%d alerts in %s, want at least drain stuck, admin state failing, webhook errors and no leader", alerts, rulesPath)
	}
	return exprs
}

// undisplayed are nodeguard's metrics deliberately on no panel and in no
// alert, each with the reason.
var undisplayed = map[string]string{
	"nodeguard_webhook_scope_mismatch": "a start-up check; its Warning event and log say what to fix",
	"nodeguard_build_info":             "an info metric: its labels name the build, for joins in other queries",
}

// TestEveryMetricIsShown checks that each metric nodeguard itself defines
// (nodeguard_*, loadbalancer_adminstate_*) is queried by a dashboard panel or
// an alert, unless listed in undisplayed: a metric nobody looks at is one
// an operator cannot use.
func TestEveryMetricIsShown(t *testing.T) {
	shown := map[string]bool{}
	for _, list := range monitoringExprs(t) {
		for _, expr := range list {
			for _, name := range metricNames(expr) {
				shown[name] = true
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(name, suffix); ok {
						shown[base] = true
					}
				}
			}
		}
	}
	var missing []string
	for name := range exportedMetrics(t) {
		if !strings.HasPrefix(name, "nodeguard_") && !strings.HasPrefix(name, "loadbalancer_adminstate_") {
			continue
		}
		_, skip := undisplayed[name]
		switch {
		case shown[name] && skip:
			t.Errorf("%s is shown but listed in undisplayed: drop it from the list", name)
		case !shown[name] && !skip:
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	for _, name := range missing {
		t.Errorf("%s is on no dashboard panel and in no alert (manifests/prometheus/): show it, or say in undisplayed why not", name)
	}
}
