package plugin

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
)

// DefaultMaxConcurrentDrains is nodeguard's default --max-concurrent-drains
// (finalizer.DefaultMaxConcurrentNodes, which the plugin does not link: it
// would bring the Azure SDK along; a test keeps the two equal).
const DefaultMaxConcurrentDrains = 10

// PlanOptions shape a dry run of removing nodes.
type PlanOptions struct {
	// MaxSurge > 0 plans an upgrade: at most MaxSurge nodes at once, each
	// replaced by a new node of the same labels (AKS's max surge). With
	// Upgrade it overrides each agent pool's concurrent drains.
	MaxSurge int
	// Upgrade plans an AKS upgrade of the nodes' agent pools with each
	// pool's upgrade settings as nodeguard read them (upgrade.go).
	Upgrade bool
	// ReimageTime is, in an upgrade, the time from a node's drained until
	// it is Ready and uncordoned again: AKS's reimage and boot.
	ReimageTime time.Duration
	// PodCycle is how long a PDB takes to allow the next eviction: from an
	// eviction until its replacement is Ready and the PDB counts it.
	PodCycle time.Duration
	// MaxConcurrentDrains is nodeguard's --max-concurrent-drains.
	MaxConcurrentDrains int
	// ControllerQPS is kube-controller-manager's --kube-api-qps: each of its
	// controllers writes at most this many requests a second, which bounds
	// how fast replacements come (0: no bound).
	ControllerQPS int
}

// PlanReport is the dry run: each node's wave and blockers, and the whole.
type PlanReport struct {
	Nodes []PlannedNode `json:"nodes"`
	// Waves is how many rounds of deletes the budgets allow.
	Waves int `json:"waves"`
	// Estimate is the time to remove every node that can go.
	Estimate time.Duration `json:"estimateNanoseconds"`
	Summary  string        `json:"summary"`
	Settings string        `json:"settingsFrom"`
	// Upgrade: an AKS upgrade was planned, with the settings of Pools and
	// ReimageTime after each wave's drains.
	Upgrade     bool          `json:"upgrade,omitempty"`
	ReimageTime time.Duration `json:"reimageNanoseconds,omitempty"`
	Pools       []PoolPlan    `json:"agentPools,omitempty"`
}

// PlannedNode is one node's part in the plan.
type PlannedNode struct {
	Node string `json:"node"`
	// Wave is when the budgets admit its delete: 1 now, 2 once wave 1's
	// nodes are gone (or replaced), ...; 0 never, as the budgets stand.
	Wave int `json:"wave"`
	// WaitsFor says what holds its delete back past wave 1.
	WaitsFor string    `json:"waitsFor,omitempty"`
	Blockers []Blocker `json:"blockers,omitempty"`
	// Lost are the pods its drain loses (no controller, emptyDir data).
	Lost []string `json:"lostPods,omitempty"`
	// Estimate is its drain's time from its PDB chains; Blocked says why
	// there is none (the drain waits on something that does not end).
	Estimate time.Duration `json:"estimateNanoseconds"`
	Blocked  string        `json:"blocked,omitempty"`
	Deleting bool          `json:"deleting,omitempty"`
	// Deadline is its drain deadline, counted from its deletion.
	Deadline DrainDeadline `json:"drainDeadline"`

	// In an upgrade: Pool is its agent pool; Wait how long its drain waits
	// for the budget after AKS cordoned it; ExceedsDrainTimeout whether
	// that wait and its drain reach the pool's drain timeout, as
	// ExceedsMessage says.
	Pool                string        `json:"agentPool,omitempty"`
	Wait                time.Duration `json:"waitNanoseconds,omitempty"`
	ExceedsDrainTimeout bool          `json:"exceedsDrainTimeout,omitempty"`
	ExceedsMessage      string        `json:"exceedsMessage,omitempty"`
}

// Plan dry-runs removing the named nodes: which the budgets admit now and in
// what order the rest follow, what each drain meets, and how long.
func (c *Cluster) Plan(ctx context.Context, names []string, o PlanOptions, settingsFrom string) (*PlanReport, error) {
	var all corev1.NodeList
	if err := c.Client.List(ctx, &all); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	ndbs, err := c.budgets(ctx)
	if err != nil {
		return nil, err
	}
	pdbs, err := c.pdbs(ctx)
	if err != nil {
		return nil, err
	}
	s := newSimulation(all.Items, ndbs, c.Now(), o.MaxSurge > 0 || o.Upgrade)
	r := &PlanReport{Settings: settingsFrom}
	if o.Upgrade {
		r.Upgrade, r.ReimageTime = true, o.ReimageTime
	}
	planned := map[string]*PlannedNode{}
	for _, name := range names {
		node := s.nodes[name]
		if node == nil {
			return nil, fmt.Errorf("node %s not found", name)
		}
		p := &PlannedNode{Node: name, Deleting: node.DeletionTimestamp != nil, Deadline: c.deadline(node, ndbs)}
		if err := c.foreseeNode(ctx, node, pdbs, ndbs, o, p); err != nil {
			return nil, err
		}
		if hold, err := c.maintenanceHold(ctx, name); err != nil {
			return nil, err
		} else if hold != nil {
			p.WaitsFor = fmt.Sprintf("maintenance Lease %s", hold)
		}
		planned[name] = p
		r.Nodes = append(r.Nodes, *p)
	}
	if o.Upgrade {
		if r.Pools, err = upgradePools(s, ndbs, names, o); err != nil {
			return nil, err
		}
		r.Waves, r.Estimate = s.upgrade(planned, r.Pools, o)
	} else {
		r.Waves = s.waves(planned, names, o.MaxSurge, 0)
		r.Estimate = waveTimes(planned, r.Waves, o)
	}
	for i := range r.Nodes {
		r.Nodes[i] = *planned[r.Nodes[i].Node]
	}
	slices.SortStableFunc(r.Nodes, func(a, b PlannedNode) int { return wavesOrder(a.Wave) - wavesOrder(b.Wave) })
	r.Summary = summary(r)
	return r, nil
}

// wavesOrder puts the nodes that never go last.
func wavesOrder(w int) int {
	if w == 0 {
		return 1 << 30
	}
	return w
}

// foreseeNode fills what the node's drain meets and its estimate.
func (c *Cluster) foreseeNode(ctx context.Context, node *corev1.Node, pdbs []policyv1.PodDisruptionBudget, ndbs []ngv1alpha1.NodeDisruptionBudget, o PlanOptions, p *PlannedNode) error {
	found, plans, err := c.foresee(ctx, node, pdbs, ndbs)
	if err != nil {
		return err
	}
	for _, f := range found {
		p.Blockers = append(p.Blockers, Blocker{Kind: string(f.Kind), Pods: f.Pods, Message: f.Message})
		if f.Kind == foresight.NoController || f.Kind == foresight.EmptyDir {
			p.Lost = append(p.Lost, f.Pods...)
		}
	}
	slices.Sort(p.Lost)
	p.Lost = slices.Compact(p.Lost)
	p.Estimate, p.Blocked = estimate(plans, found, p.Deadline.Timeout, o)
	return nil
}
