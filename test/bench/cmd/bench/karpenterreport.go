package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/bench"
)

// The Karpenter section's table and its row of docs/performance.md.

// setMedian is the median over the drainer's runs of a deletion's time.
func setMedian(runs []karpenterRun, value func(*fleetDeletion) time.Duration) time.Duration {
	var ds []time.Duration
	for _, run := range runs {
		ds = append(ds, value(&run.fleetDeletion))
	}
	return bench.Percentile(ds, 50)
}

// ratio is nodeguard's median time to release its set over
// Karpenter's, when both have runs.
func (r *karpenterResult) ratio() (float64, bool) {
	if r == nil {
		return 0, false
	}
	ng, kp := r.runsOf(drainerNodeguard), r.runsOf(drainerKarpenter)
	if len(ng) == 0 || len(kp) == 0 {
		return 0, false
	}
	released := func(f *fleetDeletion) time.Duration { return f.Released }
	return setMedian(ng, released).Seconds() / setMedian(kp, released).Seconds(), true
}

func karpenterTable(r *karpenterResult) *bench.Table {
	if r == nil || len(r.Runs) == 0 {
		return nil
	}
	budget := max(r.SetNodes/10, 1)
	t := &bench.Table{
		Title: fmt.Sprintf("7. Karpenter side by side: %d nodes per drainer (of %d at a time), %d repetitions", r.SetNodes, 2*r.SetNodes+r.Spares, len(r.Runs)/2),
		Header: []string{"drainer", "pods per set (under PDBs)", "every node released, median (range)", "95% of the nodes released", "median node released", "eviction requests", "refused (429)",
			fmt.Sprintf("most pods of a Deployment unavailable (PDB allows %d)", budget), "PDB exceeded", "drain stalled (drainer restarted)", "API requests / drained pod"},
	}
	for _, drainer := range []string{drainerNodeguard, drainerKarpenter} {
		runs := r.runsOf(drainer)
		if len(runs) == 0 {
			continue
		}
		name := fmt.Sprintf("nodeguard (its nodes deleted ×%d at once, --max-concurrent-drains=%d)", r.SetNodes, finalizer.DefaultMaxConcurrentNodes)
		if drainer == drainerKarpenter {
			name = fmt.Sprintf("Karpenter (its NodeClaims deleted ×%d at once)", r.SetNodes)
		}
		released := func(f *fleetDeletion) time.Duration { return f.Released }
		var lo, hi time.Duration
		evictions, refused, most, exceeded, requests, pods, stalls := 0, 0, 0, 0, 0, 0, 0
		for i, run := range runs {
			if i == 0 || run.Released < lo {
				lo = run.Released
			}
			hi = max(hi, run.Released)
			evictions += run.API.evictionRequests()
			refused += run.API.Evictions[429]
			most = max(most, run.Budgets.MostUnavailable)
			exceeded += run.Budgets.Exceeded
			requests += run.API.total()
			pods += run.Total
			stalls += run.Restarts
		}
		t.AddRow(name, fmt.Sprintf("%d (%d)", runs[0].Total, runs[0].UnderPDBs),
			fmt.Sprintf("%s (%s–%s)", bench.Seconds(setMedian(runs, released)), bench.Seconds(lo), bench.Seconds(hi)),
			bench.Seconds(setMedian(runs, (*fleetDeletion).mostReleased)),
			bench.Seconds(setMedian(runs, func(f *fleetDeletion) time.Duration { return f.Median })),
			fmt.Sprintf("%.0f", float64(evictions)/float64(len(runs))), fmt.Sprintf("%.0f", float64(refused)/float64(len(runs))),
			fmt.Sprint(most), fmt.Sprintf("%d times", exceeded), fmt.Sprintf("%d times", stalls), fmt.Sprintf("%.1f", float64(requests)/float64(max(pods, 1))))
	}
	if ratio, ok := r.ratio(); ok {
		ng, kp := r.runsOf(drainerNodeguard), r.runsOf(drainerKarpenter)
		most := (*fleetDeletion).mostReleased
		t.Note("nodeguard released its set in **%s Karpenter's time** (medians of the repetitions; ≤ 0.9× wanted); 95%% of it in %s Karpenter's (each drainer's pace, a stalled node apart), its median node in %s.",
			bench.Times(ratio), bench.Times(bench.Ratio(setMedian(ng, most), setMedian(kp, most))),
			bench.Times(bench.Ratio(setMedian(ng, (*fleetDeletion).median), setMedian(kp, (*fleetDeletion).median))))
	}
	t.Note("Each repetition builds both sets afresh in one cluster: Karpenter's from NodeClaims (its kwok provider; the NodePool never disrupts on its own and launches nothing), nodeguard's as kwok nodes it manages under a NodeDisruptionBudget of 100%%, with the ARM emulator (nodeguard cuts each node's traffic first, as on AKS). Each set's nodes carry one pod of each of its %d Deployments (as many replicas as the set has nodes, a PDB of maxUnavailable 10%%: %d at a time) and %d bare pods; %d spare nodes take the evicted pods. The drainers go one after the other, alternating which goes first; each starts once the other's replacements are all available.", karpenterDeployments, budget, karpenterBarePerNode, r.Spares)
	t.Note("Times run from the first delete (nodes for nodeguard, NodeClaims for Karpenter) until the node object is gone, by a 250 ms poll. Eviction requests, refusals and API requests are each drainer's own, through its own counting proxy, per repetition (the deletes included; nodeguard's watches, lists, Lease and status writes, and Karpenter's too). Karpenter drains every node at once and retries a refused eviction with a per-pod backoff (100 ms to 10 s); nodeguard drains %d nodes at a time and sends an eviction when its PDB allows one. A Deployment's pods are unavailable when not Ready, deleting or not yet replaced; \"PDB exceeded\" counts the times a Deployment had fewer than its PDB's floor.", finalizer.DefaultMaxConcurrentNodes)
	conflicts := 0
	for _, run := range r.runsOf(drainerKarpenter) {
		conflicts += run.API.Evictions[409]
	}
	t.Note("A drain stalls when no node of the set has gone for %s; the bench then restarts the drainer, as an operator would, and the time runs on. Karpenter v1.14.1 never sends an eviction again for a pod whose eviction kube-apiserver answered 409 (after 20 conflicting PDB status updates in 10 s, which its concurrent evictions under one PDB cause): its eviction queue returns without forgetting the pod, and the node drains until Karpenter restarts (kubernetes-sigs/karpenter#3144). Its evictions answered 409 in these runs: %d. nodeguard sends one eviction at a time per PDB.", drainStall, conflicts)
	var order []string
	for _, run := range r.Runs {
		if run.Nodes > 0 {
			order = append(order, fmt.Sprintf("%s %s", run.Drainer, bench.Seconds(run.Released)))
		}
	}
	t.Note("Runs in order: %s.", strings.Join(order, ", "))
	return t
}

// karpenterRow is the section's row of docs/performance.md.
func karpenterRow(r *karpenterResult) (docRow, bool) {
	ratio, ok := r.ratio()
	if !ok {
		return docRow{}, false
	}
	ng, kp := r.runsOf(drainerNodeguard), r.runsOf(drainerKarpenter)
	released := func(f *fleetDeletion) time.Duration { return f.Released }
	median := func(f *fleetDeletion) time.Duration { return f.Median }
	refused := func(runs []karpenterRun) (no, of, exceeded, stalls int) {
		for _, run := range runs {
			no += run.API.Evictions[429]
			of += run.API.evictionRequests()
			exceeded += run.Budgets.Exceeded
			stalls += run.Restarts
		}
		return no, of, exceeded, stalls
	}
	ngRefused, ngEvictions, ngExceeded, ngStalls := refused(ng)
	kpRefused, kpEvictions, kpExceeded, kpStalls := refused(kp)
	return docRow{
		key: fmt.Sprintf("karpenter/%d", r.SetNodes),
		what: fmt.Sprintf("%d nodes deleted at once, %d pods each (one of each of %d Deployments under `maxUnavailable: 10%%` PDBs, the rest bare), %d spare nodes",
			r.SetNodes, karpenterDeployments+karpenterBarePerNode, karpenterDeployments, r.Spares),
		comparator: fmt.Sprintf("Karpenter (kwok provider) deleting a set of its own nodes of the same layout through their NodeClaims, in the same cluster; %d repetitions in turns", len(ng)),
		result: fmt.Sprintf("**%s Karpenter's time**: every node released in %s against %s (95%% of them in %s against %s, median node %s against %s); evictions refused (429): %s of %s against %s of %s; PDB exceeded %d and %d times; drain stalled %d and %d times (a minute without a node gone: the drainer restarted)",
			bench.Times(ratio), bench.Seconds(setMedian(ng, released)), bench.Seconds(setMedian(kp, released)),
			bench.Seconds(setMedian(ng, (*fleetDeletion).mostReleased)), bench.Seconds(setMedian(kp, (*fleetDeletion).mostReleased)),
			bench.Seconds(setMedian(ng, median)), bench.Seconds(setMedian(kp, median)),
			thousands(ngRefused), thousands(ngEvictions), thousands(kpRefused), thousands(kpEvictions), ngExceeded, kpExceeded, ngStalls, kpStalls),
	}, true
}
