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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/budget"
)

// BudgetRow is one NodeDisruptionBudget and the nodes it counts out.
type BudgetRow struct {
	Name     string `json:"name"`
	Selector string `json:"selector"`
	Allowed  int32  `json:"disruptionsAllowed"`
	Numbers  string `json:"numbers"`
	// Unavailable are its nodes unavailable without a charge (not ready,
	// tainted, cordoned by a drain), with why.
	Unavailable []NodeOut `json:"unavailable,omitempty"`
	// Charged are the disruptions it counts, with who they are for.
	Charged []NodeOut `json:"charged,omitempty"`
}

// NodeOut is a node a budget counts out.
type NodeOut struct {
	Node  string     `json:"node"`
	Why   string     `json:"why"`
	Since *time.Time `json:"since,omitempty"`
}

// Budgets reads each NodeDisruptionBudget with the nodes it counts out:
// charged disruptions (who for, since when) and unavailable nodes.
func (c *Cluster) Budgets(ctx context.Context) ([]BudgetRow, error) {
	ndbs, err := c.budgets(ctx)
	if err != nil {
		return nil, err
	}
	var nodes corev1.NodeList
	if err := c.Client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}
	rows := make([]BudgetRow, 0, len(ndbs))
	for i := range ndbs {
		ndb := &ndbs[i]
		row := BudgetRow{Name: ndb.Name, Selector: metav1.FormatLabelSelector(ndb.Spec.Selector)}
		if n, err := budget.FromStatus(ndb, c.Now()); err != nil {
			row.Numbers = err.Error()
		} else {
			row.Allowed, row.Numbers = n.Allowed, n.String()
		}
		for name, at := range ndb.Status.DisruptedNodes {
			row.Charged = append(row.Charged, NodeOut{Node: name, Why: chargedBy(byName[name]), Since: &at.Time})
		}
		for _, node := range byName {
			if _, charged := ndb.Status.DisruptedNodes[node.Name]; charged {
				continue
			}
			if ok, err := budget.Selects(ndb, node); !ok || err != nil {
				continue
			}
			if out, why := budget.Unavailable(node, nil); out {
				row.Unavailable = append(row.Unavailable, NodeOut{Node: node.Name, Why: why})
			}
		}
		byNode := func(a, b NodeOut) int { return strings.Compare(a.Node, b.Node) }
		slices.SortFunc(row.Charged, byNode)
		slices.SortFunc(row.Unavailable, byNode)
		rows = append(rows, row)
	}
	return rows, nil
}

// PrintBudgets writes the budgets as a table, a line per node counted out.
func PrintBudgets(w io.Writer, rows []BudgetRow, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSELECTOR\tALLOWED\tNUMBERS\tCOUNTED OUT")
	for _, r := range rows {
		out := []string{}
		for _, c := range r.Charged {
			out = append(out, fmt.Sprintf("%s (charged %s ago for %s)", c.Node, ago(now, *c.Since), c.Why))
		}
		for _, u := range r.Unavailable {
			out = append(out, fmt.Sprintf("%s (%s)", u.Node, u.Why))
		}
		if len(out) == 0 {
			out = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Name, r.Selector, r.Allowed, r.Numbers, out[0])
		for _, more := range out[1:] {
			fmt.Fprintf(tw, "\t\t\t\t%s\n", more)
		}
	}
	return tw.Flush()
}
