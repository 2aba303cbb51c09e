package plugin

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/upgrade"
)

// PoolPlan is an agent pool in an upgrade plan: the upgrade settings the
// plan used and where they came from.
type PoolPlan struct {
	Name string `json:"name"`
	// Nodes are the planned nodes of the pool, in the plan's order; Size is
	// how many nodes the pool has, which AKS resolves percentages against.
	Nodes []string `json:"nodes"`
	Size  int      `json:"poolSize"`
	// The pool's upgradeSettings ("" when unset: AKS's default).
	MaxSurge                string        `json:"maxSurge,omitempty"`
	MaxUnavailable          string        `json:"maxUnavailable,omitempty"`
	DrainTimeout            time.Duration `json:"drainTimeoutNanoseconds"`
	NodeSoak                time.Duration `json:"nodeSoakNanoseconds,omitempty"`
	UndrainableNodeBehavior string        `json:"undrainableNodeBehavior"`
	// ConcurrentDrains is how many of its nodes AKS cordons and drains at
	// once: from the settings, or --max-surge.
	ConcurrentDrains int `json:"concurrentDrains"`
	// SettingsFrom names the budget whose status.agentPools gave the
	// settings, or says AKS's defaults were used and why.
	SettingsFrom string `json:"settingsFrom"`
	// Unfit are the UpgradeSettingsFit=False messages about the pool of the
	// budgets of its nodes.
	Unfit []string `json:"upgradeSettingsUnfit,omitempty"`
}

// upgradePools finds each agent pool of the named nodes (their
// kubernetes.azure.com/agentpool label) and its upgrade settings, as
// nodeguard's budget status controller read them from ARM into the
// status.agentPools of the budgets that select the pool's nodes; AKS's
// defaults when no budget has them (nodeguard without
// --aks-managed-cluster). Pools come in name order, their nodes in the
// plan's (name) order. s is read before any wave changes it.
func upgradePools(s *simulation, ndbs []ngv1alpha1.NodeDisruptionBudget, names []string, o PlanOptions) ([]PoolPlan, error) {
	byPool := map[string][]string{}
	for _, name := range names {
		pool := s.nodes[name].Labels[ngv1alpha1.AgentPoolLabel]
		if pool == "" {
			return nil, fmt.Errorf("--upgrade plans AKS agent pools, and node %s has no %s label: plan it with --max-surge", name, ngv1alpha1.AgentPoolLabel)
		}
		byPool[pool] = append(byPool[pool], name)
	}
	var out []PoolPlan
	for _, pool := range slices.Sorted(maps.Keys(byPool)) {
		nodes := slices.Sorted(slices.Values(byPool[pool]))
		size := 0
		for _, n := range s.nodes {
			if n.Labels[ngv1alpha1.AgentPoolLabel] == pool {
				size++
			}
		}
		settings, from, unfit := poolSettings(pool, nodes, s, ndbs)
		p := PoolPlan{Name: pool, Nodes: nodes, Size: size, MaxSurge: settings.MaxSurge, MaxUnavailable: settings.MaxUnavailable,
			DrainTimeout: settings.EffectiveDrainTimeout(), NodeSoak: settings.NodeSoak, UndrainableNodeBehavior: settings.Behavior(),
			ConcurrentDrains: settings.ConcurrentDrains(size), SettingsFrom: from, Unfit: unfit}
		if o.MaxSurge > 0 {
			p.ConcurrentDrains = o.MaxSurge
			p.SettingsFrom += "; concurrent drains from --max-surge"
		}
		out = append(out, p)
	}
	return out, nil
}

// poolSettings reads the pool's settings from the first budget (by name) of
// its nodes that lists it in status.agentPools, and the UpgradeSettingsFit
// messages of every such budget that judged it unfit.
func poolSettings(pool string, nodes []string, s *simulation, ndbs []ngv1alpha1.NodeDisruptionBudget) (settings upgrade.Settings, from string, unfit []string) {
	from = "AKS's defaults (maxSurge 10%, drainTimeoutInMinutes 30): no NodeDisruptionBudget of its nodes has the pool's settings in status.agentPools " +
		"(nodeguard reads them from Azure only with --aks-managed-cluster)"
	settings = upgrade.Settings{Pool: pool}
	found := false
	for i := range ndbs {
		ndb := &ndbs[i]
		if !slices.ContainsFunc(nodes, func(n string) bool { ok, err := budget.Selects(ndb, s.nodes[n]); return ok && err == nil }) {
			continue
		}
		at := slices.IndexFunc(ndb.Status.AgentPools, func(a ngv1alpha1.AgentPoolUpgrade) bool { return a.Name == pool })
		if at < 0 {
			continue
		}
		if !found {
			a := ndb.Status.AgentPools[at]
			settings = upgrade.Settings{Pool: pool, MaxSurge: a.MaxSurge, MaxUnavailable: a.MaxUnavailable,
				DrainTimeout: time.Duration(a.DrainTimeoutInMinutes) * time.Minute, NodeSoak: time.Duration(a.NodeSoakDurationInMinutes) * time.Minute,
				UndrainableNodeBehavior: a.UndrainableNodeBehavior}
			from, found = fmt.Sprintf("NodeDisruptionBudget %q status.agentPools", ndb.Name), true
		}
		if c := meta.FindStatusCondition(ndb.Status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); c != nil && c.Status == metav1.ConditionFalse {
			if msg := aboutPool(c.Message, pool); msg != "" {
				unfit = append(unfit, fmt.Sprintf("NodeDisruptionBudget %q %s=False (%s): %s", ndb.Name, c.Type, c.Reason, msg))
			}
		}
	}
	return settings, from, unfit
}

// aboutPool is the part of an UpgradeSettingsFit message about pool: the
// condition joins each unfit pool's "agent pool NAME: ..." with "; ". A
// message not in that form is kept whole.
func aboutPool(msg, pool string) string {
	parts := strings.Split(msg, "; ")
	if !slices.ContainsFunc(parts, func(p string) bool { return strings.HasPrefix(p, "agent pool ") }) {
		return msg
	}
	var out []string
	for _, p := range parts {
		if strings.HasPrefix(p, "agent pool "+pool+":") {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

// batches are the pool's nodes as AKS cordons them: ConcurrentDrains at a
// time, in the plan's order.
func (p *PoolPlan) batches() [][]string {
	return slices.Collect(slices.Chunk(p.Nodes, max(p.ConcurrentDrains, 1)))
}

// upgrade plans an AKS upgrade and returns its last wave and its time. Pool
// after pool (in name order), AKS cordons a batch of the pool's nodes and
// takes the next batch only once the whole batch is back; within a batch,
// the budgets admit the nodes' drains in waves. A wave takes its longest
// drain, then the reimage (ReimageTime), then the pool's soak. A node
// admitted in a later wave than its batch's first waits, cordoned, for the
// waves between: that wait and its drain must end within the pool's drain
// timeout, or AKS gives up on the node. A batch that never completes (a
// node never admitted, or whose drain never ends) stops its pool's plan.
func (s *simulation) upgrade(planned map[string]*PlannedNode, pools []PoolPlan, o PlanOptions) (last int, total time.Duration) {
	for i := range pools {
		pool := &pools[i]
		stuck := ""
		for _, batch := range pool.batches() {
			for _, name := range batch {
				planned[name].Pool = pool.Name
			}
			if stuck != "" {
				for _, name := range batch {
					if planned[name].WaitsFor == "" {
						planned[name].WaitsFor = fmt.Sprintf("AKS's batch of %s, which never completes", stuck)
					}
				}
				continue
			}
			first := last + 1
			last = s.waves(planned, batch, pool.ConcurrentDrains, last)
			times := map[int]time.Duration{}
			for w := first; w <= last; w++ {
				for _, name := range batch {
					if p := planned[name]; p.Wave == w && (p.Blocked == "" || p.Estimate > 0) {
						times[w] = max(times[w], p.Estimate)
					}
				}
				times[w] += o.ReimageTime + pool.NodeSoak
				total += times[w]
			}
			for _, name := range batch {
				p := planned[name]
				for w := first; w < p.Wave; w++ {
					p.Wait += times[w]
				}
				pool.judge(p)
				if stuck == "" && (p.Wave == 0 || p.Blocked != "" && p.Estimate == 0) {
					stuck = name
				}
			}
		}
	}
	return last, total
}

// judge flags a node whose wait for the budget and drain reach the pool's
// drain timeout (as upgrade.Judge does: AKS gives up when it passes), or
// that waits or drains for ever.
func (p *PoolPlan) judge(n *PlannedNode) {
	var what string
	switch {
	case n.Wave == 0:
		what = fmt.Sprintf("%s is never admitted (it waits for %s)", n.Node, dash(n.WaitsFor))
	case n.Blocked != "" && n.Estimate == 0:
		what = fmt.Sprintf("%s's drain never ends by itself (%s)", n.Node, strings.TrimPrefix(n.Blocked, "never by itself: "))
	case n.Wait+n.Estimate < p.DrainTimeout:
		return
	case n.Estimate == 0:
		what = fmt.Sprintf("%s waits about %s for the budget", n.Node, n.Wait.Round(time.Second))
	case n.Wait == 0:
		what = fmt.Sprintf("%s drains for about %s", n.Node, n.Estimate.Round(time.Second))
	default:
		what = fmt.Sprintf("%s waits about %s for the budget, then drains for about %s", n.Node, n.Wait.Round(time.Second), n.Estimate.Round(time.Second))
	}
	giveUp := "AKS fails the upgrade (Schedule)"
	if p.UndrainableNodeBehavior == upgrade.UndrainableCordon {
		giveUp = "AKS quarantines it (Cordon)"
	}
	n.ExceedsDrainTimeout = true
	n.ExceedsMessage = fmt.Sprintf("%s, past agent pool %s's drainTimeoutInMinutes %d: %s",
		what, p.Name, upgrade.Minutes(p.DrainTimeout), giveUp)
}

// printPools says, per agent pool, the settings the plan used, where they
// came from, and what the budgets judged of them.
func printPools(w io.Writer, pools []PoolPlan) {
	for _, p := range pools {
		fmt.Fprintf(w, "\nAgent pool %s: %d of its %d node(s), %d drained at once (%s), drainTimeoutInMinutes %d, soak %s, undrainable nodes: %s.\n",
			p.Name, len(p.Nodes), p.Size, p.ConcurrentDrains, upgrade.Settings{MaxSurge: p.MaxSurge, MaxUnavailable: p.MaxUnavailable}.Surge(),
			upgrade.Minutes(p.DrainTimeout), p.NodeSoak, p.UndrainableNodeBehavior)
		fmt.Fprintf(w, "  Settings from %s.\n", p.SettingsFrom)
		for _, u := range p.Unfit {
			fmt.Fprintf(w, "  %s\n", u)
		}
	}
}
