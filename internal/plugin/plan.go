package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer/drain"
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

// The replacement throughput model, as test/bench measures it: the busiest
// controller (the ReplicaSet controller) writes about 4 requests per
// replaced pod (3.1 to 4.8 in the bench's drains), from a token bucket of
// kube-controller-manager's --kube-api-burst (30) that starts full.
const (
	writesPerReplacement = 4
	controllerBurst      = 30
)

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

// estimate is a drain's time from its PDB chains: tier after tier, each as
// long as its longest chain, a chain being its PDB's pods on the node in
// rounds of what the PDB allows, one PodCycle between rounds (the first goes
// at once); but no less than kube-controller-manager needs to write the
// replacements the last evictions wait for (throughput). A blocked PDB, a do-not-evict pod or a pod under several PDBs
// make the drain wait for something that does not end by itself: until the
// drain deadline (the node's drain timeout, 0: none), if there is one.
func estimate(plans []*drain.Plan, found []foresight.Finding, deadline time.Duration, o PlanOptions) (time.Duration, string) {
	var total time.Duration
	var blocked []string
	gating := 0 // replacements that must be Ready before the last evictions
	for _, plan := range plans {
		var longest time.Duration
		for _, g := range plan.Groups {
			pods := int64(len(g.Pods))
			switch {
			case g.Blocked && g.ByDesign && replaces(found, g):
				longest = max(longest, time.Duration(pods)*o.PodCycle) // the restart replaces them one by one
				gating += int(pods)
			case g.Blocked:
				blocked = append(blocked, "PDB "+g.PDB.String())
			default:
				rounds := (pods + int64(max(g.Allowed, 1)) - 1) / int64(max(g.Allowed, 1))
				longest = max(longest, time.Duration(rounds-1)*o.PodCycle)
				gating += max(int(pods)-int(max(g.Allowed, 1)), 0)
			}
		}
		if len(plan.DoNotEvict) > 0 {
			blocked = append(blocked, "do-not-evict pods")
		}
		if len(plan.MultiplePDBs) > 0 {
			blocked = append(blocked, "pods under several PDBs")
		}
		total += longest
	}
	if len(blocked) == 0 {
		return max(total, throughput(gating, o.ControllerQPS)), ""
	}
	if deadline > 0 {
		return deadline, "until its drain deadline: " + strings.Join(blocked, ", ")
	}
	return 0, "never by itself: " + strings.Join(blocked, ", ")
}

// throughput is the least time kube-controller-manager needs to write the
// replacements that gate a drain, at qps with its burst.
func throughput(gating, qps int) time.Duration {
	if qps <= 0 {
		return 0
	}
	writes := gating*writesPerReplacement - controllerBurst
	return time.Duration(max(writes, 0)) * time.Second / time.Duration(qps)
}

// replaces reports whether nodeguard restarts g's Deployment first, as the
// finding for g says.
func replaces(found []foresight.Finding, g drain.Group) bool {
	return slices.ContainsFunc(found, func(f foresight.Finding) bool {
		return f.Kind == foresight.BlockedPDB && f.PDB == g.PDB.String() && f.Replaced
	})
}

// simulation is the cluster's nodes and budgets as deletes proceed.
type simulation struct {
	nodes map[string]*corev1.Node
	ndbs  []ngv1alpha1.NodeDisruptionBudget
	now   time.Time
	// replace: an upgrade, where each node released comes back (a new node
	// of its labels), rather than a removal.
	replace bool
}

func newSimulation(nodes []corev1.Node, ndbs []ngv1alpha1.NodeDisruptionBudget, now time.Time, replace bool) *simulation {
	s := &simulation{nodes: map[string]*corev1.Node{}, ndbs: ndbs, now: now, replace: replace}
	for i := range nodes {
		s.nodes[nodes[i].Name] = nodes[i].DeepCopy()
	}
	return s
}

// admits reports whether every budget of the node allows one more
// disruption in the simulated cluster, or names the first that does not.
func (s *simulation) admits(node *corev1.Node) (bool, string) {
	for i := range s.ndbs {
		ndb := &s.ndbs[i]
		if ok, err := budget.Selects(ndb, node); !ok || err != nil {
			continue
		}
		sel, _ := budget.Selector(ndb)
		var selected []*corev1.Node
		for _, n := range s.nodes {
			if sel.Matches(labels.Set(n.Labels)) {
				selected = append(selected, n)
			}
		}
		n, err := budget.Evaluate(ndb, selected, nil, s.now)
		if err != nil || n.Allowed <= 0 {
			return false, fmt.Sprintf("NodeDisruptionBudget %s (%s)", ndb.Name, n)
		}
	}
	return true, ""
}

// waves assigns each node its wave, after wave last: in name order, the
// nodes the budgets admit go together (at most surge, if positive); once
// they are released (or replaced) the next wave goes. A node whose drain
// never ends keeps its budgets charged. It returns the last wave.
func (s *simulation) waves(planned map[string]*PlannedNode, names []string, surge, last int) int {
	pending := slices.Clone(names)
	slices.Sort(pending)
	wave := last
	for len(pending) > 0 {
		wave++
		var admitted, rest []string
		for _, name := range pending {
			p, node := planned[name], s.nodes[name]
			switch {
			case p.Deleting && wave == last+1:
				admitted = append(admitted, name) // its delete was admitted already
			case p.WaitsFor != "" && strings.HasPrefix(p.WaitsFor, "maintenance Lease"):
				rest = append(rest, name)
			case surge > 0 && len(admitted) >= surge:
				if p.WaitsFor == "" {
					p.WaitsFor = fmt.Sprintf("max surge %d", surge)
				}
				rest = append(rest, name)
			default:
				if ok, why := s.admits(node); ok {
					node.DeletionTimestamp = &metav1.Time{Time: s.now}
					admitted = append(admitted, name)
				} else {
					if p.WaitsFor == "" {
						p.WaitsFor = why // what held it first
					}
					rest = append(rest, name)
				}
			}
		}
		if len(admitted) == 0 {
			return wave - 1 // the rest never go: Wave stays 0
		}
		for _, name := range admitted {
			planned[name].Wave = wave
			if planned[name].Blocked == "" || planned[name].Estimate > 0 {
				s.release(name)
			}
		}
		pending = rest
	}
	return wave
}

// release takes a drained node out of the simulated cluster, or, in an
// upgrade, puts a new node of its labels in its place.
func (s *simulation) release(name string) {
	old := s.nodes[name]
	delete(s.nodes, name)
	for i := range s.ndbs {
		delete(s.ndbs[i].Status.DisruptedNodes, name)
	}
	if s.replace {
		s.nodes[name+" (new)"] = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name + " (new)", Labels: old.Labels},
			Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
	}
}

// waveTimes is the plan's time: wave after wave, each wave's drains at most
// MaxConcurrentDrains at once, the longest first.
func waveTimes(planned map[string]*PlannedNode, waves int, o PlanOptions) time.Duration {
	var total time.Duration
	for w := 1; w <= waves; w++ {
		var times []time.Duration
		for _, p := range planned {
			if p.Wave == w && (p.Blocked == "" || p.Estimate > 0) {
				times = append(times, p.Estimate)
			}
		}
		slices.SortFunc(times, func(a, b time.Duration) int { return int(b - a) })
		for i := 0; i < len(times); i += max(o.MaxConcurrentDrains, 1) {
			total += times[i] // the longest of each batch
		}
	}
	return total
}

func summary(r *PlanReport) string {
	var never, blocked, past int
	for _, n := range r.Nodes {
		if n.Wave == 0 {
			never++
		}
		if n.Blocked != "" && n.Estimate == 0 {
			blocked++
		}
		if n.ExceedsDrainTimeout {
			past++
		}
	}
	from := "from the PDB chains"
	if r.Upgrade {
		from = fmt.Sprintf("(each wave's longest drain from the PDB chains, then %s of reimage and the pool's soak)", r.ReimageTime)
	}
	s := fmt.Sprintf("%d node(s) in %d wave(s), about %s %s", len(r.Nodes), r.Waves, r.Estimate.Round(time.Second), from)
	if never > 0 {
		s += fmt.Sprintf("; %d never admitted as the budgets stand", never)
	}
	if blocked > 0 {
		s += fmt.Sprintf("; %d whose drain never ends by itself", blocked)
	}
	if past > 0 {
		s += fmt.Sprintf("; %d past their agent pool's drain timeout", past)
	}
	return s
}

// Print writes the plan as a table, then the drain deadlines, each agent
// pool's upgrade settings and the nodes past their drain timeout (an
// upgrade), and each node's blockers.
func (r *PlanReport) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Upgrade {
		fmt.Fprintln(tw, "WAVE\tNODE\tPOOL\tESTIMATE\tWAIT\tDEADLINE\tBLOCKERS\tLOST PODS\tWAITS FOR")
	} else {
		fmt.Fprintln(tw, "WAVE\tNODE\tESTIMATE\tDEADLINE\tBLOCKERS\tLOST PODS\tWAITS FOR")
	}
	for _, n := range r.Nodes {
		wave := fmt.Sprint(n.Wave)
		if n.Wave == 0 {
			wave = "never"
		}
		est := n.Estimate.Round(time.Second).String()
		if n.Blocked != "" {
			est = n.Blocked
			if n.Estimate > 0 {
				est = n.Estimate.String() + " (" + n.Blocked + ")"
			}
		}
		deadline := "none"
		if n.Deadline.Timeout > 0 {
			deadline = n.Deadline.Timeout.String()
		}
		if r.Upgrade {
			wait := n.Wait.Round(time.Second).String()
			if n.Wave == 0 {
				wait = "never"
			}
			if n.ExceedsDrainTimeout {
				wait += " (past drain timeout)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", wave, n.Node, n.Pool, est, wait, deadline, len(n.Blockers), len(n.Lost), dash(n.WaitsFor))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", wave, n.Node, est, deadline, len(n.Blockers), len(n.Lost), dash(n.WaitsFor))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s (settings from %s).\n", r.Summary, r.Settings)
	r.printDeadlines(w)
	if r.Upgrade {
		printPools(w, r.Pools)
		var past []string
		for _, n := range r.Nodes {
			if n.ExceedsDrainTimeout {
				past = append(past, n.ExceedsMessage)
			}
		}
		if len(past) > 0 {
			fmt.Fprintf(w, "\nPast the drain timeout:\n  %s\n", strings.Join(past, "\n  "))
		}
	}
	for _, n := range r.Nodes {
		if len(n.Blockers) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", n.Node)
		for _, b := range n.Blockers {
			fmt.Fprintf(w, "  %s\n", b.Message)
		}
	}
	return nil
}

// printDeadlines says each drain deadline and what sets it, with its nodes:
// usually one line for all.
func (r *PlanReport) printDeadlines(w io.Writer) {
	var order []string
	nodes := map[string][]string{}
	for _, n := range r.Nodes {
		d := n.Deadline
		d.At = nil // the same timeout, whenever each deletion began
		key := d.String()
		if _, seen := nodes[key]; !seen {
			order = append(order, key)
		}
		nodes[key] = append(nodes[key], n.Node)
	}
	for _, key := range order {
		if len(order) == 1 {
			fmt.Fprintf(w, "Drain deadline: %s.\n", key)
			return
		}
		fmt.Fprintf(w, "Drain deadline %s: %s.\n", key, strings.Join(nodes[key], ", "))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
