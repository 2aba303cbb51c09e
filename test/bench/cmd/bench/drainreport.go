package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/test/bench"
)

func drainTable(rs []*drainResult) *bench.Table {
	if len(rs) == 0 {
		return nil
	}
	t := &bench.Table{
		Title: fmt.Sprintf("1. Drain: kubectl drain vs nodeguard, each alone on an identical node (median of %d runs each, range in brackets)", len(rs[0].runsOf(kubectlDrainer))),
		Header: []string{"kwok pods", "pods/node", "kubectl drain", "nodeguard", "speed-up", "chain term", "throughput term", "lower bound",
			"kubectl / bound", "nodeguard / bound", "429s kubectl", "429s nodeguard",
			"PDB allows → next eviction p50 / p99 kubectl", "PDB allows → next eviction p50 / p99 nodeguard",
			"max unavailable/PDB (budget 1) kubectl, nodeguard"},
	}
	for _, r := range rs {
		k, n := r.runsOf(kubectlDrainer), r.runsOf(nodeguardDrainer)
		bound := r.Bound.Value()
		t.AddRow(r.Profile, fmt.Sprint(r.PodsPerNode), r.Kubectl.String(), r.Nodeguard.String(), bench.Times(bench.Ratio(r.Kubectl.Median, r.Nodeguard.Median)),
			bench.Seconds(r.Bound.Chain), bench.Seconds(r.Bound.Throughput), fmt.Sprintf("%s (%s)", bench.Seconds(bound), r.Bound.Binds()),
			bench.Times(bench.Ratio(r.Kubectl.Median, bound)), bench.Times(bench.Ratio(r.Nodeguard.Median, bound)),
			refusedCell(k), refusedCell(n), wakeupCell(k), wakeupCell(n),
			fmt.Sprintf("%d, %d", maxUnavailable(k), maxUnavailable(n)))
	}
	t.Note("Each drainer has the cluster to itself: every run builds a fresh namespace, node (plus two spare nodes for the replacements), Deployments and PDBs, and starts once every pod is Ready and kube-controller-manager has written nothing for %s (its clients' token buckets full again); the previous run has ended the same way, and the two drainers take turns going first. nodeguard runs only for its own runs. Times run from the start (kubectl drain started; kubectl delete node issued) until the last pod object on the node is gone; nodeguard's include the maintenance Lease, cordon, draining taint and AdminState Down through the ARM emulator. Ratios are of the medians.", controllersQuiet)
	t.Note("Lower bound = max(chain term, throughput term). Chain term: the longest PDB chain's cycles (its rounds of evictions, pods of one PDB on the node ÷ disruptions allowed, less the first: the first round waits for no cycle, and the node is empty once the last round's pods go, before their replacements) × the cluster's own budget cycle, measured idle: the mean of evictions of one pod at a time of a Deployment under a maxUnavailable 1 PDB, each once the controllers were quiet, from the eviction request until the PDB allowed a disruption again (the eviction, the replacement created, scheduled, started and Ready, the disruption controller's status write). Throughput term: before the node can be empty, the replacements that gate the last evictions must be Ready (per PDB its pods on the node − disruptions allowed; the unprotected pods and each PDB's last pod gate nothing), and kube-controller-manager's controllers must write for each of them. The controller manager builds a client per controller, each with its own token bucket (default --kube-api-qps %d, --kube-api-burst %d, which the bench keeps), so the busiest controller, not the sum of them, caps the pace: its writes per replaced pod (audit log, from the first eviction until every replacement was Ready and the controllers quiet; the median of each drainer's runs, the fewer of the two) × the gating replacements, less the burst, ÷ the limit. The fewer, so that a drainer whose pace makes the controllers write more is not excused by it: kubectl drain's 5 s retries give each replacement status writes of its own, which a faster drain's controllers merge, so kubectl's count alone would overstate what the cluster must write. Under pod-general a pod starts in 1–6 s at random, so the chain term is an estimate: the chain's expected time is its cycles × the mean cycle (a median of a few samples strayed by 25%% between runs), and the term is good to about its cycles × two standard errors of that mean (in the notes below); a ratio near 1.0× means at the bound.", kcmClientQPS, kcmClientBurst)
	t.Note("PDB allows → next eviction (the wake-up delay, all runs pooled): from each moment a PDB went from allowing no disruption to allowing one, as the benchmark's own watch of the PDBs delivers it, to the drainer's eviction request that used it, at the proxy (the k-th such change pairs with the drainer's (k+1)-th granted eviction of that PDB: budget 1). kubectl drain retries every 5 s; nodeguard's parked queue is woken by the status change (its own view of the same delay is the metric nodeguard_drain_wakeup_delay_seconds). A request that beat the benchmark's watch counts 0.")
	for _, r := range rs {
		k, n := r.runsOf(kubectlDrainer), r.runsOf(nodeguardDrainer)
		t.Note("%s: chain term %d rounds, %d cycles × idle cycle %s (mean of %d ± %s standard error, %s–%s) = %s; throughput term: the busiest controller, %s, wrote %.2f per replaced pod in kubectl's runs and %.2f in nodeguard's: %.2f × %d gating replacements − %d = %.0f writes ÷ %d/s = %s; the %s term binds.",
			r.Profile, r.Chain, max(r.Chain-1, 0), bench.Millis(r.Cycle), len(r.IdleCycles), bench.Millis(bench.StdErr(r.IdleCycles)), bench.Millis(bench.Percentile(r.IdleCycles, 0)), bench.Millis(bench.Percentile(r.IdleCycles, 100)), bench.Seconds(r.Bound.Chain),
			orNone(r.Busiest), writesPerPod(replacementsOf(k), r.Busiest, r.PodsPerNode), writesPerPod(replacementsOf(n), r.Busiest, r.PodsPerNode), r.WritesPerPod, r.Gating, kcmClientBurst,
			max(r.WritesPerPod*float64(r.Gating)-kcmClientBurst, 0), kcmClientQPS, bench.Seconds(r.Bound.Throughput), r.Bound.Binds())
		if longest := longestChain(r); longest > r.Bound.Chain {
			t.Note("%s: the chain term is one chain's expected time; the drain waits for the longest of the node's %d chains at once, which with these idle cycles is expected at %s (the mean of %d trials, each chain %d cycles drawn from the %d measured), %s the chain term; nodeguard's median is %s of it. The bound and the ratios above stay one chain's.",
				r.Profile, r.Chains, bench.Seconds(longest), longestDraws, r.Chain-1, len(r.IdleCycles),
				bench.Times(bench.Ratio(longest, r.Bound.Chain)), bench.Times(bench.Ratio(r.Nodeguard.Median, longest)))
		}
		t.Note("%s: runs in order: %s. Medians: first eviction request after %s (kubectl) and %s (nodeguard: Lease, cordon, taint, traffic cut); kubectl drain exited at %s; nodeguard released its node (finalizer removed) at %s; the longest PDB's own cycles summed to %s (kubectl) and %s (nodeguard).",
			r.Profile, runsCell(r.Runs), bench.Millis(medianOf(k, func(d *drainRun) time.Duration { return d.FirstEviction })),
			bench.Millis(medianOf(n, func(d *drainRun) time.Duration { return d.FirstEviction })),
			bench.Seconds(medianOf(k, func(d *drainRun) time.Duration { return d.Done })), bench.Seconds(medianOf(n, func(d *drainRun) time.Duration { return d.Done })),
			bench.Seconds(medianOf(k, func(d *drainRun) time.Duration { return d.OwnChain })), bench.Seconds(medianOf(n, func(d *drainRun) time.Duration { return d.OwnChain })))
		if est := medianOf(n, func(d *drainRun) time.Duration { return d.PlanEstimate }); est > 0 {
			t.Note("%s: kubectl nodeguard plan, run just before each nodeguard drain with the idle cycle as --pod-cycle, estimated %s (median), %s nodeguard's median drain of %s (issue #44 wants the estimate within 2×).",
				r.Profile, bench.Seconds(est), bench.Times(bench.Ratio(est, r.Nodeguard.Median)), bench.Seconds(r.Nodeguard.Median))
		}
		t.Note("%s: kube-controller-manager's writes while each drainer's median run drained, from its first eviction until its node was empty: kubectl: %s; nodeguard: %s.",
			r.Profile, loadCell(medianRun(k).controllers()), loadCell(medianRun(n).controllers()))
	}
	return t
}

// longestDraws are the trials of bench.LongestOfChains.
const longestDraws = 10000

// longestChain is when the longest of the node's chains is expected to end,
// when the chain term binds; zero otherwise (the estimate is not drawn).
func longestChain(r *drainResult) time.Duration {
	if r.Bound.Binds() != "chain" {
		return 0
	}
	return bench.LongestOfChains(r.Chains, r.Chain-1, r.IdleCycles, longestDraws)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// refusedCell is the evictions refused (429) of all requests, over the runs.
func refusedCell(runs []*drainRun) string {
	refused, sent := 0, 0
	for _, r := range runs {
		refused += r.TooMany
		sent += r.Evictions
	}
	return fmt.Sprintf("%d of %d", refused, sent)
}

func wakeupCell(runs []*drainRun) string {
	var all []time.Duration
	for _, r := range runs {
		all = append(all, r.Wakeups...)
	}
	s := bench.Summarize(all)
	if s.N == 0 {
		return "none"
	}
	return fmt.Sprintf("%s / %s (n %d)", bench.Millis(s.P50), bench.Millis(s.P99), s.N)
}

func maxUnavailable(runs []*drainRun) int {
	m := 0
	for _, r := range runs {
		m = max(m, r.MaxUnavailable)
	}
	return m
}

// runsCell lists the runs as they went, e.g. "kubectl 17.6 s, nodeguard 6.87 s".
func runsCell(runs []*drainRun) string {
	var parts []string
	for _, r := range runs {
		parts = append(parts, r.Drainer+" "+bench.Seconds(r.Empty))
	}
	return strings.Join(parts, ", ")
}

// replacementsOf are the runs' writes to replace their pods.
func replacementsOf(runs []*drainRun) [][]controllerLoad {
	var out [][]controllerLoad
	for _, r := range runs {
		out = append(out, r.Replacement)
	}
	return out
}

func timesOf(runs []*drainRun, f func(*drainRun) time.Duration) []time.Duration {
	var v []time.Duration
	for _, r := range runs {
		v = append(v, f(r))
	}
	return v
}

func medianOf(runs []*drainRun, f func(*drainRun) time.Duration) time.Duration {
	return bench.Percentile(timesOf(runs, f), 50)
}

// medianRun is the run whose time to empty is the median (nil for none).
func medianRun(runs []*drainRun) *drainRun {
	m := medianOf(runs, func(d *drainRun) time.Duration { return d.Empty })
	for _, r := range runs {
		if r.Empty == m {
			return r
		}
	}
	return nil
}

func (r *drainRun) controllers() []controllerLoad {
	if r == nil {
		return nil
	}
	return r.Controllers
}

func drainPanels(rs []*drainResult) []bench.Panel {
	var ps []bench.Panel
	for _, r := range rs {
		k, n := medianRun(r.runsOf(kubectlDrainer)), medianRun(r.runsOf(nodeguardDrainer))
		if k == nil || n == nil {
			continue
		}
		ps = append(ps, bench.Panel{
			Title: fmt.Sprintf("kwok %s, median runs: kubectl drain %s, nodeguard %s (%.1f× faster)", r.Profile, bench.Seconds(k.Empty), bench.Seconds(n.Empty),
				bench.Ratio(k.Empty, n.Empty)),
			YLabel: "pods on the node",
			Series: []bench.Series{
				{Name: "kubectl drain", Color: "#d62728", Points: k.Timeline},
				{Name: "nodeguard", Color: "#1f77b4", Points: n.Timeline},
			},
			Marker: r.Bound.Value(), MarkerLabel: "lower bound",
		})
	}
	return ps
}
