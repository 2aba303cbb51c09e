package plugin

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// summary is the plan's line under the table: its waves and time, and the
// nodes it cannot promise.
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

// dash stands for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
