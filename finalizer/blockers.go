package finalizer

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// The grouped drain message follows cluster-api's Machine Deleting condition,
// so that people and tools reading both find the same shape: a first line,
// then one line per cause naming at most maxBlockerPods pods, at most
// maxBlockerGroups such lines.
const (
	maxBlockerGroups = 5
	maxBlockerPods   = 3
	// DrainStaleAfter is how long a drain runs before its condition adds what
	// the delay is likely due to (cluster-api's 15 minutes).
	DrainStaleAfter = 15 * time.Minute
)

// blockerGroup is one line of the message: pods and what holds them.
type blockerGroup struct {
	pods []*corev1.Pod
	why  string
}

// drainMessage is the Terminating condition's message while the node drains:
//
//	Drain not completed yet (started at 2026-11-26T15:40:00Z):
//	* Pods demo/web-0, demo/web-1, demo/web-2, ... (1 more): under PDB demo/web (allows 0 disruptions: ...); ...
//	* Pod demo/db-0: terminating, waiting for it to go
//	After above Pods have been removed from the Node, the following Pods will be evicted: ...
//	Drain deadline in 41m (--drain-timeout): then the remaining Pods are deleted
//	Drain in progress for more than 15m0s, delay likely due to PodDisruptionBudgets
//
// A zero deadline means the drain has none.
func drainMessage(plan *drain.Plan, out drain.Outcome, started, deadline, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Drain not completed yet (started at %s):", started.UTC().Format(time.RFC3339))
	groups := blockerGroups(plan, out)
	for i, g := range groups {
		if i == maxBlockerGroups && len(groups) > maxBlockerGroups {
			n := 0
			for _, rest := range groups[i:] {
				n += len(rest.pods)
			}
			fmt.Fprintf(&b, "\n* %s with other issues", podsWord(n))
			break
		}
		fmt.Fprintf(&b, "\n* %s: %s", podList(g.pods), g.why)
	}
	if len(plan.Later) > 0 {
		fmt.Fprintf(&b, "\nAfter above Pods have been removed from the Node, the following Pods will be evicted: %s", names(plan.Later))
	}
	if !deadline.IsZero() {
		fmt.Fprintf(&b, "\nDrain deadline in %s (--drain-timeout): then the remaining Pods are deleted", roughly(deadline.Sub(now)))
	}
	if now.Sub(started) > DrainStaleAfter {
		if causes := delayCauses(plan, out); len(causes) > 0 {
			fmt.Fprintf(&b, "\nDrain in progress for more than %s, delay likely due to %s", DrainStaleAfter, strings.Join(causes, ", "))
		}
	}
	return b.String()
}

// blockerGroups lists the causes in cluster-api's order: pods already
// terminating, pods whose eviction a PDB holds, then the rest.
func blockerGroups(plan *drain.Plan, out drain.Outcome) []blockerGroup {
	var groups []blockerGroup
	add := func(pods []*corev1.Pod, why string) {
		if len(pods) > 0 {
			groups = append(groups, blockerGroup{pods: pods, why: why})
		}
	}
	add(plan.Terminating, "deletionTimestamp set, but still not removed from the Node")
	refused := map[types.NamespacedName]bool{}
	for _, pdb := range out.Blocked {
		refused[pdb] = true
	}
	for _, g := range plan.Groups {
		add(append(append([]*corev1.Pod{}, g.Pods...), g.Replacing...), pdbCause(g, refused[g.PDB]))
	}
	add(plan.DoNotEvict, "annotated "+ngv1alpha1.DoNotEvictAnnotation+"=true, waiting for them to go on their own")
	add(append(append([]*corev1.Pod{}, plan.MultiplePDBs...), out.MultiplePDBs...),
		"selected by more than one PodDisruptionBudget, so the Eviction API refuses them")
	add(plan.Unprotected, "under no PodDisruptionBudget, being evicted")
	return groups
}

// pdbCause names the PDB with its numbers and what its queue waits for.
func pdbCause(g drain.Group, refused bool) string {
	why := fmt.Sprintf("under PDB %s (allows %d disruptions: currentHealthy %d, desiredHealthy %d, expectedPods %d)",
		g.PDB, g.Allowed, g.Healthy, g.Desired, g.Expected)
	switch {
	case g.Note != "":
		why += "; " + g.Note
	case refused:
		why += "; eviction refused, waiting for its status to change"
	case g.Blocked:
		why += "; waiting for its status to change"
	default:
		why += "; being evicted one at a time"
	}
	return why
}

// delayCauses are cluster-api's words for what a long drain likely waits on.
func delayCauses(plan *drain.Plan, out drain.Outcome) []string {
	var causes []string
	for _, g := range plan.Groups {
		if g.Blocked || g.Allowed == 0 {
			causes = append(causes, "PodDisruptionBudgets")
			break
		}
	}
	if len(plan.Terminating) > 0 {
		causes = append(causes, "Pods not terminating")
	}
	if len(plan.MultiplePDBs)+len(out.MultiplePDBs)+len(out.Errs) > 0 {
		causes = append(causes, "Pod eviction errors")
	}
	if len(plan.DoNotEvict) > 0 {
		causes = append(causes, "Pods annotated "+ngv1alpha1.DoNotEvictAnnotation)
	}
	return causes
}

// podList is "Pod ns/a" or "Pods ns/a, ns/b, ns/c, ... (2 more)".
func podList(pods []*corev1.Pod) string {
	word := "Pods"
	if len(pods) == 1 {
		word = "Pod"
	}
	return word + " " + names(pods)
}

// names lists at most maxBlockerPods pods by namespace/name.
func names(pods []*corev1.Pod) string { return namesUpTo(pods, maxBlockerPods) }

// namesUpTo lists at most n pods by namespace/name.
func namesUpTo(pods []*corev1.Pod, n int) string {
	list := make([]string, 0, min(len(pods), n))
	for _, p := range pods[:min(len(pods), n)] {
		list = append(list, p.Namespace+"/"+p.Name)
	}
	return listUpTo(list, len(pods))
}

// listUpTo joins the names shown of total, then says how many more there are:
// "ns/a, ns/b, ... (3 more)".
func listUpTo(shown []string, total int) string {
	if more := total - len(shown); more > 0 {
		shown = append(shown[:len(shown):len(shown)], fmt.Sprintf("... (%d more)", more))
	}
	return strings.Join(shown, ", ")
}

// podsWord is "1 Pod" or "3 Pods", in cluster-api's capitals.
func podsWord(n int) string { return count(n, "Pod") }
