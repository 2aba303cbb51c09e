package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The summary table of docs/performance.md is rendered from the results:
// one row per comparison, each with a stable key in a hidden comment of its
// first cell. Several runs feed it (the full `make bench`, the --scale run),
// so --docs rewrites only the rows a results.json has data for and keeps the
// others as they are.
const (
	summaryBegin = "<!-- bench:summary:begin -->"
	summaryEnd   = "<!-- bench:summary:end -->"
	// summaryHeader heads the table in performance-rows.md.
	summaryHeader = "| | comparator | result |\n|---|---|---|\n"
)

var rowKeyRE = regexp.MustCompile(`<!-- bench:row (\S+) -->`)

// docRow is one row of the summary table.
type docRow struct {
	key, what, comparator, result string
}

func (r docRow) markdown() string {
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	return fmt.Sprintf("| <!-- bench:row %s --> %s | %s | %s |", r.key, cell(r.what), cell(r.comparator), cell(r.result))
}

// summaryRows are the rows the results have data for, in the table's order.
func summaryRows(res *results) []docRow {
	var rows []docRow
	for _, d := range res.Drain {
		rows = append(rows, drainRow(d))
	}
	for _, d := range res.Drain {
		if row, ok := wakeupRow(d); ok {
			rows = append(rows, row)
		}
	}
	rows = append(rows, cutoverRows(res.Cutover)...)
	rows = append(rows, admissionRows(res.Admit)...)
	rows = append(rows, scaleRows(res.Scale)...)
	if res.Rolling != nil {
		rows = append(rows, rollingRow(res.Rolling))
	}
	if res.Replace != nil {
		rows = append(rows, replaceRow(res.Replace))
	}
	if row, ok := karpenterRow(res.Karpenter); ok {
		rows = append(rows, row)
	}
	return rows
}

func drainRow(r *drainResult) docRow {
	k, n := r.runsOf(kubectlDrainer), r.runsOf(nodeguardDrainer)
	bound := r.Bound.Value()
	boundCell := bench.Seconds(bound)
	if r.Bound.Binds() == "chain" && len(r.IdleCycles) > 1 {
		// The chain term is an estimate from the idle cycles: good to
		// about its cycles × two standard errors of their mean.
		boundCell += " ± " + bench.Seconds(time.Duration(2*max(r.Chain-1, 0))*bench.StdErr(r.IdleCycles))
	}
	return docRow{
		key: "drain/" + r.Profile,
		what: fmt.Sprintf("Drain a node with %d pods, Deployments under `maxUnavailable: 1` PDBs (the longest a chain of %d evictions) and unprotected pods, kwok `%s`%s",
			r.PodsPerNode, r.Chain, r.Profile, profileNotes[r.Profile]),
		comparator: fmt.Sprintf("`kubectl drain --ignore-daemonsets --delete-emptydir-data` on an identical node; each drainer alone, %d runs each, in turns", r.Nodeguard.N),
		result: fmt.Sprintf("%s against %s: %.1f× faster; **%s the lower bound** of %s, set by the %s term (chain %s, throughput %s), kubectl %s; "+
			"evictions refused (429): %s against %s; at most %d pod of a PDB unavailable (budget 1) and %d eviction in flight per PDB, against %d and %d",
			r.Nodeguard, r.Kubectl, bench.Ratio(r.Kubectl.Median, r.Nodeguard.Median),
			bench.Times(bench.Ratio(r.Nodeguard.Median, bound)), boundCell, r.Bound.Binds(), bench.Seconds(r.Bound.Chain), bench.Seconds(r.Bound.Throughput),
			bench.Times(bench.Ratio(r.Kubectl.Median, bound)), refusedCell(n), refusedCell(k),
			maxUnavailable(n), mostInFlight(n), maxUnavailable(k), mostInFlight(k)),
	}
}

// profileNotes say what a kwok pod-stage profile means to a reader.
var profileNotes = map[string]string{harness.PodsGeneral: " (pods start in 1–6 s)"}

func mostInFlight(runs []*drainRun) int {
	m := 0
	for _, r := range runs {
		m = max(m, r.MaxInFlight)
	}
	return m
}

func wakeupRow(r *drainResult) (docRow, bool) {
	wakeups := func(runs []*drainRun) bench.Summary {
		var all []time.Duration
		for _, run := range runs {
			all = append(all, run.Wakeups...)
		}
		return bench.Summarize(all)
	}
	k, n := wakeups(r.runsOf(kubectlDrainer)), wakeups(r.runsOf(nodeguardDrainer))
	if k.N == 0 || n.N == 0 {
		return docRow{}, false
	}
	ms := func(s bench.Summary) string {
		return fmt.Sprintf("%s / %s ms", millis(s.P50), millis(s.P99))
	}
	return docRow{
		key:        "wakeup/" + r.Profile,
		what:       fmt.Sprintf("PDB allows a disruption again → the drainer's eviction that uses it (wake-up delay), p50 / p99, kwok `%s`", r.Profile),
		comparator: "`kubectl drain`, in the same runs",
		result:     fmt.Sprintf("%s against kubectl's %s (n %d and %d)", ms(n), ms(k), n.N, k.N),
	}, true
}

// millis is a duration in milliseconds, to a tenth below 100 ms.
func millis(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	if v < 100 {
		return fmt.Sprintf("%.1f", v)
	}
	return thousands(int(v + 0.5))
}

func cutoverRows(r *cutoverResult) []docRow {
	if r == nil || r.Nodeguard == nil || r.PerPool == nil {
		return nil
	}
	ng, pp := r.Nodeguard, r.PerPool
	rows := []docRow{{
		key:        "cutover",
		what:       fmt.Sprintf("Taint → AdminState `Down` in the %d pools of one load balancer (every AKS public-LB node; ARM latency %s)", r.PoolsNode, r.ARMLatency),
		comparator: "a writer per pool, retrying 412s",
		result: fmt.Sprintf("p50 %s ms, p99 %s ms, **%d** 412s (%d trials), against %s / %s ms with %d 412s",
			millis(ng.Applied.P50), millis(ng.Applied.P99), ng.Answers412, ng.Applied.N, millis(pp.Applied.P50), millis(pp.Applied.P99), pp.Answers412),
	}}
	if len(ng.Fleet) == 0 || len(pp.Fleet) == 0 {
		return rows
	}
	fleet := func(s *cutoverSide) string {
		var answers412 int
		var puts []int
		var down []time.Duration
		for _, f := range s.Fleet {
			answers412 += f.Answers412
			puts = append(puts, f.PUTs)
			down = append(down, f.AfterAccept)
		}
		return fmt.Sprintf("%d 412s, %d–%d PUTs a round, all Down %s–%s after the last taint",
			answers412, slices.Min(puts), slices.Max(puts), strings.TrimSuffix(bench.Seconds(slices.Min(down)), " s"), bench.Seconds(slices.Max(down)))
	}
	return append(rows, docRow{
		key:        "cutover-fleet",
		what:       fmt.Sprintf("%d nodes over %d load balancers × %d pools tainted at once, %d rounds", ng.Fleet[0].Nodes, len(cutoverLBs), len(cutoverPools), len(ng.Fleet)),
		comparator: "same",
		result:     fmt.Sprintf("%s (one PUT per node per pool: %d), against %s", fleet(ng), ng.Fleet[0].Naive, fleet(pp)),
	})
}

func admissionRows(r *admitResult) []docRow {
	if r == nil {
		return nil
	}
	noop, ng := r.Latency[modeNoop], r.Latency[modeNodeguard]
	ratio := func(op string) (p50, p99 float64) {
		return bench.Ratio(ng[op].P50, noop[op].P50), bench.Ratio(ng[op].P99, noop[op].P99)
	}
	cu50, _ := ratio("CREATE")
	up50, _ := ratio("UPDATE")
	del50, del99 := ratio("DELETE")
	one50, one99 := ratio("DELETE, 1 client")
	ev50, ev99 := ratio(opEviction)
	return []docRow{{
		key:        "admission-create-update",
		what:       "Node CREATE / UPDATE admission",
		comparator: "no-op webhook at the same registrations",
		result: fmt.Sprintf("%.1f× / %.1f× p50 (%s / %s ms against %s / %s ms, %d clients)", cu50, up50,
			millis(ng["CREATE"].P50), millis(ng["UPDATE"].P50), millis(noop["CREATE"].P50), millis(noop["UPDATE"].P50), r.Clients),
	}, {
		key:        "admission-delete",
		what:       "Node DELETE admission (budget claim)",
		comparator: "same",
		result: fmt.Sprintf("with %d concurrent deletes under one budget: %.2f× p50, %.2f× p99 (%s / %s ms against %s / %s ms); one delete at a time: %.2f× p50, %.2f× p99",
			r.Clients, del50, del99, millis(ng["DELETE"].P50), millis(ng["DELETE"].P99), millis(noop["DELETE"].P50), millis(noop["DELETE"].P99), one50, one99),
	}, {
		key:        "admission-eviction",
		what:       "Eviction admission, schedulable node",
		comparator: "same",
		result: fmt.Sprintf("%.2f× p50, %.2f× p99 (%s / %s ms against %s / %s ms, %d clients)", ev50, ev99,
			millis(ng[opEviction].P50), millis(ng[opEviction].P99), millis(noop[opEviction].P50), millis(noop[opEviction].P99), r.Clients),
	}}
}

// minSlopeNodes is the least run the row extrapolates nodeguard's RSS from:
// below it the growth between a tenth of the nodes and all of them is a few
// MiB, within the noise of the samples.
const minSlopeNodes = 1000

// rssTargetNodes is the fleet size nodeguard's idle RSS is extrapolated to.
const rssTargetNodes = 5000

// extrapolatedRSS is nodeguard's idle RSS at nodes, from the growth between
// the idle points (and pods in proportion).
func (r *scaleResult) extrapolatedRSS(nodes int) (int64, bool) {
	slope, ok := r.rssPerThousandNodes()
	if !ok {
		return 0, false
	}
	last := r.Idle[len(r.Idle)-1]
	return int64(float64(last.RSS) + slope*float64(nodes-last.Nodes)/1000), true
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// phaseNamed is the scale section's phase of that name, or nil.
func (r *scaleResult) phaseNamed(name string) *scalePhase {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}

func scaleRows(r *scaleResult) []docRow {
	if r == nil {
		return nil
	}
	var rows []docRow
	size := fmt.Sprint(r.Nodes)
	idle, deleting := r.phaseNamed(idlePhase(r.Nodes, r.Pods)), r.phaseNamed(nodeguardDeletionPhase(r.Deleted))
	if idle != nil && deleting != nil {
		ofKCM := func(p *scalePhase) float64 {
			return float64(p.RSS["nodeguard"]) / float64(max(p.RSS["kube-controller-manager"], 1))
		}
		result := fmt.Sprintf("%s idle (%.2f× of KCM); at most %s (%.2f×) while it deletes %d nodes (--max-concurrent-drains=%d)",
			mib(idle.RSS["nodeguard"]), ofKCM(idle), mib(deleting.RSS["nodeguard"]), ofKCM(deleting), r.Deleted, r.Parallel)
		if slope, ok := r.rssPerThousandNodes(); ok && r.Nodes >= minSlopeNodes {
			at, _ := r.extrapolatedRSS(rssTargetNodes)
			result += fmt.Sprintf("; idle, it grows %s per 1,000 nodes: %s extrapolated to %s nodes and %s pods (target 150 MiB)",
				mib(int64(slope)), mib(at), thousands(rssTargetNodes), thousands(rssTargetNodes*r.Pods/max(r.Nodes, 1)))
		}
		rows = append(rows, docRow{
			key:        "memory/" + size,
			what:       fmt.Sprintf("Memory, %s nodes / %s pods", thousands(r.Nodes), thousands(r.Pods)),
			comparator: "kube-controller-manager",
			result:     result,
		})
	}
	ng, k := r.Nodeguard, r.Kubectl
	if ng == nil || k == nil {
		return rows
	}
	result := fmt.Sprintf("every node released in %s against %s (%s; median node %s against %s); evictions refused (429): %d of %s against %d of %s; "+
		"PDB exceeded %d and %d times (at most %d and %d of a Deployment's pods unavailable, %d allowed); %.1f API requests per drained pod against %.1f",
		bench.Seconds(ng.Released), bench.Seconds(k.Released), bench.Times(bench.Ratio(ng.Released, k.Released)), bench.Seconds(ng.Median), bench.Seconds(k.Median),
		ng.API.Evictions[429], thousands(ng.API.evictionRequests()), k.API.Evictions[429], thousands(k.API.evictionRequests()),
		ng.Budgets.Exceeded, k.Budgets.Exceeded, ng.Budgets.MostUnavailable, k.Budgets.MostUnavailable, scaleBudget, ng.perPod(), k.perPod())
	if w := ng.writesPerNode(); w.total() > 0 {
		result += fmt.Sprintf("; %.1f writes of nodes, node status and events per deleted node, %d events dropped", w.total(), ng.EventsDropped)
	}
	if b := r.Bound; b != nil && b.value() > 0 {
		result += fmt.Sprintf("; **%s its lower bound** of %s (%s term; the loop %s)",
			bench.Times(bench.Ratio(ng.Released, b.value())), bench.Seconds(b.value()), b.binds(), bench.Times(bench.Ratio(k.Released, b.value())))
		if b.Eviction > 0 {
			result += fmt.Sprintf(", %s of the chain and throughput terms alone", bench.Times(bench.Ratio(ng.Released, b.twoTerms())))
		}
	}
	if ng.Handoff.count() > 0 {
		result += "; drain slot handoff " + ng.Handoff.summary()
	}
	return append(rows, docRow{
		key: "fleet/" + size,
		what: fmt.Sprintf("%d of %s nodes (%s pods) deleted at once under an NDB of `maxUnavailable: %s`, pods under PDBs",
			r.Deleted, thousands(r.Nodes), thousands(r.Pods), scaleNDB),
		comparator: fmt.Sprintf("`kubectl drain --force` + `kubectl delete node`, %d at a time (nodeguard's default `--max-concurrent-drains`: %d)", r.Parallel, finalizer.DefaultMaxConcurrentNodes),
		result:     result,
	})
}

func rollingRow(r *rollingResult) docRow {
	const kubectl, nodeguard = 0, 1
	return docRow{
		key: "rolling",
		what: fmt.Sprintf("Rolling replacement: %d nodes replaced under an NDB of `maxUnavailable: %d`, %d Deployments × %d under `minAvailable: %d` PDBs, a helper creating a new node as each old one goes",
			r.Nodes, rollingBudget, r.Apps, r.Replicas, r.Replicas-1),
		comparator: fmt.Sprintf("a script running `kubectl drain` + `kubectl delete node` on %d nodes at a time", rollingBudget),
		result: fmt.Sprintf("%s against %s; at most %d and %d nodes unavailable (budget %d), exceeded %d and %d times; PDB broken %d and %d times; evictions refused (429): %d of %d against %d of %d",
			bench.Seconds(r.Total[nodeguard]), bench.Seconds(r.Total[kubectl]), r.MaxUnavailable[nodeguard], r.MaxUnavailable[kubectl], rollingBudget,
			r.NodeViolations[nodeguard], r.NodeViolations[kubectl], r.PDBViolations[nodeguard], r.PDBViolations[kubectl],
			r.API[nodeguard].Evictions[429], r.API[nodeguard].evictionRequests(), r.API[kubectl].Evictions[429], r.API[kubectl].evictionRequests()),
	}
}

func replaceRow(r *replaceResult) docRow {
	kubectl := fmt.Sprintf("kubectl drain finished in %s", bench.Seconds(r.KubectlExit))
	if !r.KubectlDone {
		kubectl = fmt.Sprintf("kubectl drain gave up after %s and %d refused evictions, its pod still there", bench.Seconds(r.KubectlExit), r.KubectlRefusals)
	}
	return docRow{
		key:        "replace",
		what:       "A node holding the only replica of a Deployment under `minAvailable: 1` (replacement first)",
		comparator: fmt.Sprintf("`kubectl drain --timeout=%s` on an identical node, at the same time", r.Timeout),
		result: fmt.Sprintf("nodeguard released its node in %s (%s of it the settle time), never fewer than %d Ready replica, %d evictions; %s (never fewer than %d Ready)",
			bench.Seconds(r.NodeguardReleased), finalizer.DefaultBlockedPDBSettle, r.MinReady[1], r.NodeguardEvictions, kubectl, r.MinReady[0]),
	}
}

// thousands formats n with thousands separators: "40,000".
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// summaryMarkdown is the rendered table, for performance-rows.md.
func summaryMarkdown(rows []docRow) string {
	var b strings.Builder
	b.WriteString(summaryHeader)
	for _, r := range rows {
		b.WriteString(r.markdown() + "\n")
	}
	return b.String()
}

// rewriteSummary replaces the rows of the summary table between the markers
// whose keys rows hold, appends the rows it lacks at the table's end, and
// keeps every other line. It returns the keys of the rows it kept.
func rewriteSummary(doc string, rows []docRow) (string, []string, error) {
	if strings.Count(doc, summaryBegin) != 1 || strings.Count(doc, summaryEnd) != 1 {
		return "", nil, fmt.Errorf("want the markers %q and %q once each around the summary table", summaryBegin, summaryEnd)
	}
	begin, end := strings.Index(doc, summaryBegin)+len(summaryBegin), strings.Index(doc, summaryEnd)
	if end < begin {
		return "", nil, fmt.Errorf("%q comes before %q", summaryEnd, summaryBegin)
	}
	fresh := map[string]string{}
	for _, r := range rows {
		fresh[r.key] = r.markdown()
	}
	lines := strings.Split(doc[begin:end], "\n")
	seen := map[string]bool{}
	var kept []string
	last := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "|") {
			last = i
		}
		m := rowKeyRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		key := m[1]
		if seen[key] {
			return "", nil, fmt.Errorf("row %s twice in the summary table", key)
		}
		seen[key] = true
		if row, ok := fresh[key]; ok {
			lines[i] = row
		} else {
			kept = append(kept, key)
		}
	}
	if last < 0 {
		return "", nil, fmt.Errorf("no table between %q and %q", summaryBegin, summaryEnd)
	}
	var added []string
	for _, r := range rows {
		if !seen[r.key] {
			added = append(added, r.markdown())
		}
	}
	lines = slices.Insert(lines, last+1, added...)
	return doc[:begin] + strings.Join(lines, "\n") + doc[end:], kept, nil
}

// updateDocs rewrites the summary table in the doc at path with the rows the
// results have data for. A smoke run or one with a failed section does not
// go into the docs.
func updateDocs(path string, res *results) error {
	if quick, _ := res.Config["quick"].(bool); quick {
		return fmt.Errorf("--docs: a --quick run does not go into %s", path)
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("--docs: the run has %d failed section(s); %s left as it was", len(res.Errors), path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	rows := summaryRows(res)
	doc, kept, err := rewriteSummary(string(raw), rows)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.key)
	}
	logf("%s: rewrote the rows %s; kept %s (no data in this run)", path, strings.Join(keys, ", "), orNone(strings.Join(kept, ", ")))
	return nil
}
