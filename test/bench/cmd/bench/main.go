// Command bench is `make bench`: nodeguard against its comparators, side by
// side, in one run, on full local clusters (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok) and the ARM emulator:
//
//  1. drain: kubectl drain and nodeguard each empty an identical node alone,
//     in turns, three times each, under the kwok pod-fast and pod-general
//     stage profiles, against a lower bound from the cluster's idle budget
//     cycle and its controllers' client limits;
//  2. cutover: taint-to-Down latency of the load-balancer admin state for
//     nodes in two pools of one load balancer, 412s counted, against a writer
//     per pool; and 100 nodes over 2 load balancers tainted at once;
//  3. admission: latency of node CREATE/UPDATE/DELETE through the real
//     apiserver with nodeguard's webhooks against a no-op webhook;
//  4. scale: nodeguard's RSS and CPU with many kwok nodes and pods, idle and
//     while nodes drain, beside kube-controller-manager's; one node in 20
//     deleted at once under a 10% node budget, against a kubectl drain loop
//     at the same parallelism (time, 429s, API requests per drained pod);
//  5. replace: a node holding the only replica of a Deployment under
//     minAvailable: 1, kubectl drain --timeout against nodeguard's
//     replacement first;
//  6. rolling: every node of a group replaced under a node budget of 3 and
//     PDBs, a helper playing the autoscaler, against a kubectl drain +
//     delete script 3 nodes at a time;
//  7. karpenter: Karpenter (kwok provider) deleting a set of its nodes
//     through their NodeClaims against nodeguard deleting a set of the same
//     size and pod layout, in one cluster, in turns.
//
// Every figure is a ratio or a count measured in the same run; absolute times
// are context. It prints a markdown table and writes it, the raw numbers
// (results.json), the drain timelines (drain-timeline.svg) and the rows of
// docs/performance.md's summary table (performance-rows.md) to --out;
// --docs puts those rows into the doc.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"go.uber.org/zap/zapcore"

	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/harness"
)

// config is what a run measures, and how much.
type config struct {
	nodeguard string
	out       string
	sections  []string
	profiles  []string
	quick     bool

	drainApps, drainReplicas, drainFree int
	drainReps, idleCycles               int

	cutTrials      int
	armLatency     time.Duration
	fleetNodes     int
	fleetRounds    int
	admissionN     int
	admissionConc  int
	admissionRound int

	scaleNodes, scalePods, scaleDelete int
	scaleIdle                          time.Duration
	scaleCycles                        int

	replaceTimeout time.Duration

	rollingNodes, rollingApps, rollingReplicas int

	karpenterSet, karpenterSpares, karpenterReps int
}

func main() {
	c := config{}
	var sections, profiles string
	var scale bool
	flag.StringVar(&c.nodeguard, "nodeguard", filepath.Join(harness.RepoRoot(), "_output", "bench", "nodeguard"), "The nodeguard binary under test.")
	flag.StringVar(&c.out, "out", filepath.Join(harness.RepoRoot(), "_output", "bench"), "Directory for results.md, results.json, drain-timeline.svg and the clusters' logs.")
	flag.StringVar(&sections, "sections", "drain,cutover,admission,scale,replace,rolling,karpenter", "Comma-separated sections to run.")
	flag.StringVar(&profiles, "profiles", harness.PodsFast+","+harness.PodsGeneral, "kwok pod-stage profiles of the drain section.")
	flag.BoolVar(&c.quick, "quick", false, "A smoke run of a few minutes: pod-fast only, small workloads, few trials.")
	flag.BoolVar(&scale, "scale", false, "Run the scale section at full size (2,000 nodes, 40,000 pods: long and heavy) instead of 200 nodes and 4,000 pods, and the karpenter section with 100 nodes per drainer and 300 spares instead of 20 and 60.")
	scaleNodes := flag.Int("scale-nodes", 0, "Nodes of the scale section (default 200, 2,000 with --scale); pods are 20 per node unless --scale-pods says otherwise.")
	scalePods := flag.Int("scale-pods", 0, "Pods of the scale section (default 20 per node).")
	flag.DurationVar(&c.armLatency, "arm-latency", 50*time.Millisecond, "Fixed latency the ARM emulator adds to every call in the cutover section.")
	reportFrom := flag.String("report-from", "", "Run nothing: rebuild results.md, results.json and drain-timeline.svg in --out from an earlier run's results.json, with this build's summaries and tables (after a change to the report).")
	docs := flag.String("docs", "", "Also rewrite the summary table of this doc (docs/performance.md) with the rows this run has data for, keeping the others; e.g. --report-from=_output/bench/results.json --docs=docs/performance.md.")
	nodeguardFlags := flag.String("nodeguard-flags", "", "Space-separated flags added to every nodeguard the benchmark starts, e.g. --pprof-bind-address=127.0.0.1:6060 to profile it while it runs.")
	flag.Parse()
	extraNodeguardFlags = strings.Fields(*nodeguardFlags)
	c.sections = strings.Split(sections, ",")
	c.profiles = strings.Split(profiles, ",")
	c.drainApps, c.drainReplicas, c.drainFree = 4, 10, 10
	c.drainReps, c.idleCycles = 3, 25
	c.cutTrials, c.fleetNodes, c.fleetRounds = 200, 100, 3
	c.admissionN, c.admissionConc, c.admissionRound = 100, 8, 4
	c.scaleNodes, c.scalePods, c.scaleIdle = 200, 4000, 30*time.Second
	c.scaleCycles = 6
	c.replaceTimeout = 5 * time.Minute
	c.rollingNodes, c.rollingApps, c.rollingReplicas = 20, 4, 10
	c.karpenterSet, c.karpenterSpares, c.karpenterReps = 20, 60, 3
	if scale {
		c.scaleNodes, c.scalePods, c.scaleIdle = 2000, 40000, 60*time.Second
		c.karpenterSet, c.karpenterSpares = 100, 300
	}
	if c.quick {
		c.profiles = []string{harness.PodsFast}
		c.drainApps, c.drainReplicas, c.drainFree = 2, 5, 4
		c.drainReps, c.idleCycles = 1, 3
		c.cutTrials, c.fleetNodes, c.fleetRounds = 30, 40, 1
		c.admissionN, c.admissionRound = 30, 1
		c.replaceTimeout = time.Minute
		c.rollingNodes, c.rollingApps, c.rollingReplicas = 6, 2, 6
		c.karpenterSet, c.karpenterSpares, c.karpenterReps = 10, 20, 1
		c.scaleCycles = 2
		if !scale {
			c.scaleNodes, c.scalePods, c.scaleIdle = 40, 400, 10*time.Second
		}
	}
	if *scaleNodes > 0 {
		n := *scaleNodes
		c.scaleNodes, c.scalePods = n, 20*n
	}
	if *scalePods > 0 {
		c.scalePods = *scalePods
	}
	// One node in 20 per drainer: 100 of 2,000 at --scale, within the
	// NDB's 10%.
	c.scaleDelete = max(c.scaleNodes/20, 1)
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	var res *results
	var err error
	if *reportFrom != "" {
		res, err = rereport(c, *reportFrom)
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		res, err = run(ctx, c)
	}
	if err == nil && *docs != "" {
		err = updateDocs(*docs, res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// results is everything a run measured, written as results.json.
type results struct {
	Started   time.Time        `json:"started"`
	Duration  string           `json:"duration"`
	Config    map[string]any   `json:"config"`
	Drain     []*drainResult   `json:"drain,omitempty"`
	Cutover   *cutoverResult   `json:"cutover,omitempty"`
	Admit     *admitResult     `json:"admission,omitempty"`
	Scale     *scaleResult     `json:"scale,omitempty"`
	Replace   *replaceResult   `json:"replace,omitempty"`
	Rolling   *rollingResult   `json:"rolling,omitempty"`
	Karpenter *karpenterResult `json:"karpenter,omitempty"`
	Tables    []*bench.Table   `json:"tables"`
	Panels    []bench.Panel    `json:"panels,omitempty"`
	Errors    []string         `json:"errors,omitempty"`
}

func (c config) has(section string) bool { return slices.Contains(c.sections, section) }

func run(ctx context.Context, c config) (*results, error) {
	if _, err := os.Stat(c.nodeguard); err != nil {
		return nil, fmt.Errorf("nodeguard binary %s: %w (make bench builds it)", c.nodeguard, err)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return nil, err
	}
	res := &results{Started: time.Now(), Config: map[string]any{
		"quick": c.quick, "sections": c.sections, "profiles": c.profiles,
		"drain": fmt.Sprintf("%d Deployments x %d replicas under maxUnavailable 1 + %d unprotected pods per node, %d runs per drainer, %d idle cycles",
			c.drainApps, c.drainReplicas, c.drainFree, c.drainReps, c.idleCycles),
		"cutover":   fmt.Sprintf("%d trials, ARM latency %s, %d nodes x %d rounds", c.cutTrials, c.armLatency, c.fleetNodes, c.fleetRounds),
		"admission": fmt.Sprintf("%d per operation x %d rounds, %d clients", c.admissionN, c.admissionRound, c.admissionConc),
		"scale":     fmt.Sprintf("%d nodes, %d pods, %d nodes deleted per drainer, idle %s", c.scaleNodes, c.scalePods, c.scaleDelete, c.scaleIdle),
		"replace":   fmt.Sprintf("1 replica under minAvailable 1, kubectl drain --timeout=%s", c.replaceTimeout),
		"rolling":   fmt.Sprintf("%d nodes per drainer, %d Deployments x %d replicas, node budget %d", c.rollingNodes, c.rollingApps, c.rollingReplicas, rollingBudget),
		"karpenter": fmt.Sprintf("%d nodes per drainer, %d spares, %d repetitions", c.karpenterSet, c.karpenterSpares, c.karpenterReps),
	}}
	fail := func(section string, err error) {
		msg := fmt.Sprintf("%s: %v", section, err)
		fmt.Fprintln(os.Stderr, "bench: "+msg)
		res.Errors = append(res.Errors, msg)
	}
	needShared := c.has("cutover") || c.has("admission") || c.has("replace") || c.has("rolling")
	for i, profile := range c.profiles {
		if !c.has("drain") && (i > 0 || !needShared) {
			break
		}
		if ctx.Err() != nil {
			break
		}
		logf("starting a cluster with kwok %s pod stages", profile)
		audit := ""
		if c.has("drain") {
			audit = drainAuditPolicy(drainNamespaces(c))
		}
		env, err := startCluster(ctx, filepath.Join(c.out, "cluster-"+profile), profile, false, audit)
		if err != nil {
			fail("cluster "+profile, err)
			continue
		}
		if c.has("drain") {
			d, err := runDrain(ctx, c, env, profile)
			if err != nil {
				fail("drain "+profile, err)
			}
			if d != nil {
				res.Drain = append(res.Drain, d)
			}
		}
		if i == 0 && c.has("admission") && ctx.Err() == nil {
			a, err := runAdmission(ctx, c, env)
			if err != nil {
				fail("admission", err)
			}
			res.Admit = a
		}
		if i == 0 && c.has("cutover") && ctx.Err() == nil {
			r, err := runCutover(ctx, c, env)
			if err != nil {
				fail("cutover", err)
			}
			res.Cutover = r
		}
		if i == 0 && c.has("replace") && ctx.Err() == nil {
			r, err := runReplace(ctx, c, env, profile)
			if err != nil {
				fail("replace", err)
			}
			res.Replace = r
		}
		if i == 0 && c.has("rolling") && ctx.Err() == nil {
			r, err := runRolling(ctx, c, env)
			if err != nil {
				fail("rolling", err)
			}
			res.Rolling = r
		}
		_ = env.Stop()
	}
	// The scale and karpenter sections each have a cluster of their own,
	// with kwok at fleet parallelism.
	inOwnCluster := func(section string, run func(*harness.Env) error) {
		if !c.has(section) || ctx.Err() != nil {
			return
		}
		logf("starting a cluster for the %s section", section)
		env, err := startCluster(ctx, filepath.Join(c.out, "cluster-"+section), harness.PodsFast, true, "")
		if err != nil {
			fail("cluster "+section, err)
			return
		}
		defer func() { _ = env.Stop() }()
		if err := run(env); err != nil {
			fail(section, err)
		}
	}
	inOwnCluster("scale", func(env *harness.Env) (err error) {
		res.Scale, err = runScale(ctx, c, env)
		return err
	})
	inOwnCluster("karpenter", func(env *harness.Env) (err error) {
		res.Karpenter, err = runKarpenter(ctx, c, env)
		return err
	})
	res.Duration = time.Since(res.Started).Round(time.Second).String()
	return res, writeResults(c, res)
}

// rereport rebuilds the report of an earlier run from its results.json: the
// drain section's summaries and bound are computed again from its runs.
func rereport(c config, path string) (*results, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var res results
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	for _, d := range res.Drain {
		d.summarize()
	}
	if res.Scale != nil {
		for i, p := range res.Scale.Idle {
			if p.RSS == 0 { // a run from before the median: its peak
				res.Scale.Idle[i].RSS = p.Peak
			}
		}
	}
	res.Tables, res.Panels = nil, nil
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return nil, err
	}
	return &res, writeResults(c, &res)
}

func writeResults(c config, res *results) error {
	res.Tables = append(res.Tables, drainTable(res.Drain), cutoverTable(res.Cutover), admissionTable(res.Admit), scaleTable(res.Scale), fleetTable(res.Scale), replaceTable(res.Replace), rollingTable(res.Rolling), karpenterTable(res.Karpenter))
	res.Tables = slices.DeleteFunc(res.Tables, func(t *bench.Table) bool { return t == nil })
	var md bytes.Buffer
	fmt.Fprintf(&md, "## nodeguard benchmark results\n\n")
	fmt.Fprintf(&md, "Run %s on %s (%s, `%s`). Ratios and counts are measured side by side in the same run; absolute times are context only (shared, noisy 2-core machine).\n\n",
		res.Started.UTC().Format("2006-01-02 15:04 MST"), hostInfo(), res.Duration, strings.Join(os.Args[1:], " "))
	for _, t := range res.Tables {
		t.WriteMarkdown(&md)
	}
	if len(res.Panels) == 0 {
		res.Panels = drainPanels(res.Drain)
	}
	if len(res.Panels) > 0 {
		fmt.Fprintf(&md, "![Pods left on the drained node over time: kubectl drain vs nodeguard](drain-timeline.svg)\n\n")
	}
	for _, e := range res.Errors {
		fmt.Fprintf(&md, "**Error:** %s\n\n", e)
	}
	fmt.Print("\n" + md.String())
	if err := os.WriteFile(filepath.Join(c.out, "results.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "results.json"), raw, 0o644); err != nil {
		return err
	}
	rows := summaryMarkdown(summaryRows(res))
	rows = fmt.Sprintf("The summary table of docs/performance.md from this run: `bench --report-from=results.json --docs=docs/performance.md` puts these rows into it, keeping the rows this run has no data for.\n\n%s", rows)
	if err := os.WriteFile(filepath.Join(c.out, "performance-rows.md"), []byte(rows), 0o644); err != nil {
		return err
	}
	if len(res.Panels) > 0 {
		f, err := os.Create(filepath.Join(c.out, "drain-timeline.svg"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := bench.WriteTimelineSVG(f, "Pods left on the drained node: kubectl drain vs nodeguard", res.Panels); err != nil {
			return err
		}
	}
	logf("wrote %s/results.md, results.json, performance-rows.md and drain-timeline.svg", c.out)
	if len(res.Errors) > 0 {
		return fmt.Errorf("%d section(s) failed", len(res.Errors))
	}
	return nil
}

func hostInfo() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, %d CPUs", host, runtime.NumCPU())
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
