package drain

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	ngbudget "github.com/nodeguard/nodeguard/budget"
)

// Timeout is the node's drain timeout: the shortest positive one of the
// node's own (its annotation nodeguard.io/drain-timeout if that is a
// duration, else global, --drain-timeout) and the drainTimeout of each of
// budgets that selects the node; 0 means no deadline. A budget or a node
// with 0 sets none: it never lifts a deadline another one sets. source names
// the one that applies, e.g. `NodeDisruptionBudget "web" drainTimeout`. A bad
// annotation is returned as err, the node's own timeout then being global's:
// the drain ignores it.
//
// budgets may hold budgets that do not select the node (a caller's whole
// list): each is matched here, so that every caller selects alike. One whose
// selector cannot be evaluated selects no node, as for admission.
func Timeout(node *corev1.Node, global time.Duration, budgets []ngv1alpha1.NodeDisruptionBudget) (timeout time.Duration, source string, err error) {
	timeout, source = global, "--drain-timeout"
	if v, ok := node.Annotations[ngv1alpha1.DrainTimeoutAnnotation]; ok {
		if d, perr := time.ParseDuration(v); perr != nil || d < 0 {
			err = fmt.Errorf("ignoring annotation %s=%q: not a duration such as 30m", ngv1alpha1.DrainTimeoutAnnotation, v)
		} else {
			timeout, source = d, "annotation "+ngv1alpha1.DrainTimeoutAnnotation
		}
	}
	// The shortest budget deadline; ties go to the first budget by name, so
	// that the source does not change with a list's order.
	var shortest *ngv1alpha1.NodeDisruptionBudget
	for i := range budgets {
		ndb := &budgets[i]
		if ndb.Spec.DrainTimeout == nil || ndb.Spec.DrainTimeout.Duration <= 0 {
			continue
		}
		if ok, serr := ngbudget.Selects(ndb, node); !ok || serr != nil {
			continue
		}
		if shortest == nil || ndb.Spec.DrainTimeout.Duration < shortest.Spec.DrainTimeout.Duration ||
			ndb.Spec.DrainTimeout.Duration == shortest.Spec.DrainTimeout.Duration && ndb.Name < shortest.Name {
			shortest = ndb
		}
	}
	// A tie with the node's own goes to the node's own: the source it had
	// before budgets had deadlines.
	if shortest != nil && (timeout <= 0 || shortest.Spec.DrainTimeout.Duration < timeout) {
		return shortest.Spec.DrainTimeout.Duration, "NodeDisruptionBudget " + strconv.Quote(shortest.Name) + " drainTimeout", err
	}
	return timeout, source, err
}
