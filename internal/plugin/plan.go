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
	"github.com/nodeguard/nodeguard/internal/foresight"
)

// DefaultMaxConcurrentDrains is nodeguard's default --max-concurrent-drains
// (finalizer.DefaultMaxConcurrentNodes, which the plugin does not link: it
// would bring the Azure SDK along; a test keeps the two equal).
const DefaultMaxConcurrentDrains = 10

// PlanOptions shape a dry run of removing nodes.
type PlanOptions struct {
	// MaxSurge > 0 plans an upgrade: at most MaxSurge nodes at once, each
	// replaced by a new node of the same labels (AKS's max surge).
	MaxSurge int
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
	s := newSimulation(all.Items, ndbs, c.Now())
	r := &PlanReport{Settings: settingsFrom}
	planned := map[string]*PlannedNode{}
	for _, name := range names {
		node := s.nodes[name]
		if node == nil {
			return nil, fmt.Errorf("node %s not found", name)
		}
		p := &PlannedNode{Node: name, Deleting: node.DeletionTimestamp != nil}
		if err := c.foreseeNode(ctx, node, pdbs, o, p); err != nil {
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
	r.Waves = s.waves(planned, names, o)
	r.Estimate = waveTimes(planned, r.Waves, o)
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
func (c *Cluster) foreseeNode(ctx context.Context, node *corev1.Node, pdbs []policyv1.PodDisruptionBudget, o PlanOptions, p *PlannedNode) error {
	found, plans, err := c.foresee(ctx, node, pdbs)
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
	p.Estimate, p.Blocked = estimate(plans, found, c.Settings, node, o)
	return nil
}

// estimate is a drain's time from its PDB chains: tier after tier, each as
// long as its longest chain, a chain being its PDB's pods on the node in
// rounds of what the PDB allows, one PodCycle between rounds (the first goes
// at once); but no less than kube-controller-manager needs to write the
// replacements the last evictions wait for (throughput). A blocked PDB, a do-not-evict pod or a pod under several PDBs
// make the drain wait for something that does not end by itself: until the
// drain deadline, if there is one.
func estimate(plans []*drain.Plan, found []foresight.Finding, s foresight.Settings, node *corev1.Node, o PlanOptions) (time.Duration, string) {
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
	if timeout, _, _ := drain.Timeout(node, s.DrainTimeout); timeout > 0 {
		return timeout, "until its drain deadline: " + strings.Join(blocked, ", ")
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
}

func newSimulation(nodes []corev1.Node, ndbs []ngv1alpha1.NodeDisruptionBudget, now time.Time) *simulation {
	s := &simulation{nodes: map[string]*corev1.Node{}, ndbs: ndbs, now: now}
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

// waves assigns each node its wave: in name order, the nodes the budgets
// admit go together (at most MaxSurge); once they are released (or
// replaced) the next wave goes. A node whose drain never ends keeps its
// budgets charged. It returns the number of waves.
func (s *simulation) waves(planned map[string]*PlannedNode, names []string, o PlanOptions) int {
	pending := slices.Clone(names)
	slices.Sort(pending)
	wave := 0
	for len(pending) > 0 {
		wave++
		var admitted, rest []string
		for _, name := range pending {
			p, node := planned[name], s.nodes[name]
			switch {
			case p.Deleting && wave == 1:
				admitted = append(admitted, name) // its delete was admitted already
			case p.WaitsFor != "" && strings.HasPrefix(p.WaitsFor, "maintenance Lease"):
				rest = append(rest, name)
			case o.MaxSurge > 0 && len(admitted) >= o.MaxSurge:
				if p.WaitsFor == "" {
					p.WaitsFor = fmt.Sprintf("max surge %d", o.MaxSurge)
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
				s.release(name, o)
			}
		}
		pending = rest
	}
	return wave
}

// release takes a drained node out of the simulated cluster, or, in an
// upgrade, puts a new node of its labels in its place.
func (s *simulation) release(name string, o PlanOptions) {
	old := s.nodes[name]
	delete(s.nodes, name)
	for i := range s.ndbs {
		delete(s.ndbs[i].Status.DisruptedNodes, name)
	}
	if o.MaxSurge > 0 {
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
	var never, blocked int
	for _, n := range r.Nodes {
		if n.Wave == 0 {
			never++
		}
		if n.Blocked != "" && n.Estimate == 0 {
			blocked++
		}
	}
	s := fmt.Sprintf("%d node(s) in %d wave(s), about %s from the PDB chains", len(r.Nodes), r.Waves, r.Estimate.Round(time.Second))
	if never > 0 {
		s += fmt.Sprintf("; %d never admitted as the budgets stand", never)
	}
	if blocked > 0 {
		s += fmt.Sprintf("; %d whose drain never ends by itself", blocked)
	}
	return s
}

// Print writes the plan as a table, then each node's blockers.
func (r *PlanReport) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tNODE\tESTIMATE\tBLOCKERS\tLOST PODS\tWAITS FOR")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", wave, n.Node, est, len(n.Blockers), len(n.Lost), dash(n.WaitsFor))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s (settings from %s).\n", r.Summary, r.Settings)
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

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
