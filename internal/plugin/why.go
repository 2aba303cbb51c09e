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
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// WhyReport is why a node is still there, or what its deletion would meet.
type WhyReport struct {
	Node string `json:"node"`
	// Deleting is when its deletion began (nil: not being deleted).
	Deleting *time.Time `json:"deleting,omitempty"`
	// State is cordoned, draining-tainted, not ready... in words.
	State []string `json:"state,omitempty"`
	// DeleteNow is what a delete would be answered now (not deleting only).
	DeleteNow  string         `json:"deleteNow,omitempty"`
	Conditions []WhyCondition `json:"conditions,omitempty"`
	Budgets    []BudgetOfNode `json:"budgets,omitempty"`
	Lease      string         `json:"maintenanceLease,omitempty"`
	Blockers   []Blocker      `json:"blockers,omitempty"`
	// Deadline is when its drain stops waiting for pods that do not go.
	Deadline DrainDeadline `json:"drainDeadline"`
	Events   []EventLine   `json:"events,omitempty"`
	Settings string        `json:"settingsFrom"`
}

// WhyCondition is one of nodeguard's node conditions.
type WhyCondition struct {
	Type    string    `json:"type"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// BudgetOfNode is a budget that selects the node.
type BudgetOfNode struct {
	Name    string `json:"name"`
	Allowed int32  `json:"disruptionsAllowed"`
	Numbers string `json:"numbers"`
	// Charged says whether, and since when, the budget counts this node
	// disrupted.
	Charged *time.Time `json:"chargedSince,omitempty"`
}

// Blocker is one thing the node's drain meets, grouped by kind.
type Blocker struct {
	Kind    string   `json:"kind"`
	Pods    []string `json:"pods,omitempty"`
	Message string   `json:"message"`
}

// EventLine is one event about the node.
type EventLine struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
}

// nodeguardConditions are the node conditions nodeguard writes.
var nodeguardConditions = []corev1.NodeConditionType{ngv1alpha1.TerminatingCondition, ngv1alpha1.TrafficCutCondition,
	"nodeguard.io/DrainInProgress", "nodeguard.io/Drained"}

// lastEvents is how many of the node's events why shows.
const lastEvents = 10

// Why reads why node is still there: its deletion, nodeguard's conditions,
// the budgets and Lease that hold it, what its drain meets, its last events.
func (c *Cluster) Why(ctx context.Context, name, settingsFrom string) (*WhyReport, error) {
	node, err := c.node(ctx, name)
	if err != nil {
		return nil, err
	}
	r := &WhyReport{Node: name, Settings: settingsFrom, State: state(node)}
	if node.DeletionTimestamp != nil {
		r.Deleting = &node.DeletionTimestamp.Time
	}
	for _, t := range nodeguardConditions {
		for _, cond := range node.Status.Conditions {
			if cond.Type == t {
				r.Conditions = append(r.Conditions, WhyCondition{Type: string(t), Status: string(cond.Status), Reason: cond.Reason,
					Message: cond.Message, Since: cond.LastTransitionTime.Time})
			}
		}
	}
	ndbs, err := c.budgets(ctx)
	if err != nil {
		return nil, err
	}
	for _, ndb := range selecting(ndbs, node) {
		n, err := budget.FromStatus(ndb, c.Now())
		if err != nil {
			return nil, fmt.Errorf("NodeDisruptionBudget %s: %w", ndb.Name, err)
		}
		b := BudgetOfNode{Name: ndb.Name, Allowed: n.Allowed, Numbers: n.String()}
		if at, ok := ndb.Status.DisruptedNodes[name]; ok {
			b.Charged = &at.Time
		}
		r.Budgets = append(r.Budgets, b)
	}
	hold, err := c.maintenanceHold(ctx, name)
	if err != nil {
		return nil, err
	}
	if hold != nil {
		r.Lease = fmt.Sprintf("Lease %s/%s %s", ngv1alpha1.MaintenanceLeaseNamespace, name, hold)
	}
	if node.DeletionTimestamp == nil {
		r.DeleteNow = deleteNow(r, hold)
	}
	pdbs, err := c.pdbs(ctx)
	if err != nil {
		return nil, err
	}
	found, _, err := c.foresee(ctx, node, pdbs, ndbs)
	if err != nil {
		return nil, err
	}
	r.Deadline = c.deadline(node, ndbs)
	for _, f := range found {
		r.Blockers = append(r.Blockers, Blocker{Kind: string(f.Kind), Pods: f.Pods, Message: f.Message})
	}
	r.Events, err = c.events(ctx, name)
	return r, err
}

// state names what marks the node: cordoned, draining, not ready.
func state(node *corev1.Node) []string {
	var s []string
	if ngv1alpha1.Cordoned(node) {
		s = append(s, "cordoned")
	}
	if slices.ContainsFunc(node.Spec.Taints, ngv1alpha1.IsDrainingTaint) {
		s = append(s, "tainted "+ngv1alpha1.DrainingTaintKey)
	}
	if unavailable, why := budget.Unavailable(node, nil); unavailable && why != "deleting" && why != "draining" {
		s = append(s, why)
	}
	if !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		s = append(s, "without nodeguard's finalizer (not managed, or not yet backfilled)")
	}
	return s
}

// deleteNow says how nodeguard would answer a delete of the node now.
func deleteNow(r *WhyReport, hold *budget.Hold) string {
	if hold != nil {
		return "denied (429): " + r.Lease
	}
	var none []string
	for _, b := range r.Budgets {
		if b.Allowed <= 0 {
			none = append(none, fmt.Sprintf("NodeDisruptionBudget %s (%s)", b.Name, b.Numbers))
		}
	}
	if len(none) > 0 {
		return "denied (429): no disruption left in " + strings.Join(none, ", ")
	}
	if len(r.Budgets) == 0 {
		return "admitted: no NodeDisruptionBudget selects the node"
	}
	return "admitted: every NodeDisruptionBudget of the node allows one more disruption"
}

// events reads the node's last events, newest last.
func (c *Cluster) events(ctx context.Context, node string) ([]EventLine, error) {
	var list eventsv1.EventList
	if err := c.Client.List(ctx, &list, client.MatchingFields{"regarding.name": node, "regarding.kind": "Node"}); err != nil {
		return nil, fmt.Errorf("listing the events of node %s: %w", node, err)
	}
	var out []EventLine
	for _, e := range list.Items {
		at := e.EventTime.Time
		if e.Series != nil {
			at = e.Series.LastObservedTime.Time
		} else if at.IsZero() {
			at = e.DeprecatedLastTimestamp.Time
		}
		out = append(out, EventLine{Time: at, Type: e.Type, Reason: e.Reason, Message: e.Note})
	}
	slices.SortStableFunc(out, func(a, b EventLine) int { return a.Time.Compare(b.Time) })
	return out[max(len(out)-lastEvents, 0):], nil
}

// Print writes the report as kubectl describe would.
func (r *WhyReport) Print(w io.Writer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Node:\t%s\n", r.Node)
	switch {
	case r.Deleting != nil:
		fmt.Fprintf(tw, "Deleting:\tsince %s (%s ago)\n", r.Deleting.UTC().Format(time.RFC3339), ago(now, *r.Deleting))
	default:
		fmt.Fprintf(tw, "Deleting:\tno; a delete now would be %s\n", r.DeleteNow)
	}
	if len(r.State) > 0 {
		fmt.Fprintf(tw, "State:\t%s\n", strings.Join(r.State, ", "))
	}
	if r.Lease != "" {
		fmt.Fprintf(tw, "Maintenance:\t%s\n", r.Lease)
	}
	section(tw, "Conditions", len(r.Conditions), "none of nodeguard's")
	for _, c := range r.Conditions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s ago\t%s\n", c.Type, c.Status, c.Reason, ago(now, c.Since), c.Message)
	}
	section(tw, "Budgets", len(r.Budgets), "no NodeDisruptionBudget selects the node")
	for _, b := range r.Budgets {
		charged := "not charged for this node"
		if b.Charged != nil {
			charged = fmt.Sprintf("charged for this node %s ago", ago(now, *b.Charged))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", b.Name, b.Numbers, charged)
	}
	what := "What its drain meets"
	if r.Deleting == nil {
		what = "What a drain would meet"
	}
	section(tw, what, len(r.Blockers), "nothing: no blocked PDB, no pod it waits for or loses")
	for _, b := range r.Blockers {
		fmt.Fprintf(tw, "  %s\t%s\n", b.Kind, b.Message)
	}
	fmt.Fprintf(tw, "Drain deadline:\t%s\n", r.Deadline)
	section(tw, fmt.Sprintf("Events (last %d)", lastEvents), len(r.Events), "none")
	for _, e := range r.Events {
		fmt.Fprintf(tw, "  %s ago\t%s\t%s\t%s\n", ago(now, e.Time), e.Type, e.Reason, e.Message)
	}
	fmt.Fprintf(tw, "Settings:\tfrom %s\n", r.Settings)
	return tw.Flush()
}

// section starts a section, or says it has nothing.
func section(w io.Writer, title string, n int, none string) {
	if n == 0 {
		fmt.Fprintf(w, "%s:\t%s\n", title, none)
		return
	}
	fmt.Fprintf(w, "%s:\n", title)
}

// ago renders a duration as kubectl does: 5s, 3m, 2h, 4d.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
