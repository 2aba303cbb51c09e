package plugin

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// simulation is the cluster's nodes and budgets as deletes proceed.
type simulation struct {
	nodes map[string]*corev1.Node
	ndbs  []ngv1alpha1.NodeDisruptionBudget
	now   time.Time
	// replace: an upgrade, where each node released comes back (a new node
	// of its labels), rather than a removal.
	replace bool
}

// newSimulation starts from the cluster as read.
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
