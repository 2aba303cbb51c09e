package budget

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// allowedCondition is the DisruptionAllowed condition for a budget's numbers
// (or the error evaluating them). The status controller and the claims both
// set it, so that a claim's write leaves the status controller nothing to
// rewrite.
func allowedCondition(n Numbers, err error, generation int64) metav1.Condition {
	cond := metav1.Condition{Type: ngv1alpha1.ConditionDisruptionAllowed, ObservedGeneration: generation}
	switch {
	case errors.As(err, new(*InvalidSelectorError)):
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ngv1alpha1.ReasonInvalidSelector,
			err.Error()+": the budget selects no node and guards none; fix its selector"
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ngv1alpha1.ReasonInvalidSpec, err.Error()
	case n.Expected == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ngv1alpha1.ReasonNoMatchingNodes
		cond.Message = "no node matches spec.selector: the budget guards none"
	case n.Allowed > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ngv1alpha1.ReasonSufficientNodes, n.String()
	case n.Window != nil:
		cond.Status, cond.Reason = metav1.ConditionFalse, ngv1alpha1.ReasonWindowActive
		cond.Message = fmt.Sprintf("%s; disruption window %q ends %s", n, n.Window.Schedule, n.Window.Ends.UTC().Format(time.RFC3339))
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ngv1alpha1.ReasonInsufficientNodes, n.String()
	}
	return cond
}

// windowsCondition says whether every window of the budget can open, or nil
// when it has none.
func windowsCondition(ndb *ngv1alpha1.NodeDisruptionBudget, now time.Time) *metav1.Condition {
	if len(ndb.Spec.Windows) == 0 {
		return nil
	}
	cond := metav1.Condition{Type: ngv1alpha1.ConditionWindowsFire, ObservedGeneration: ndb.Generation,
		Status: metav1.ConditionTrue, Reason: ngv1alpha1.ReasonWindowsFire, Message: "every window's schedule fires"}
	if never := NeverFiring(ndb.Spec.Windows, now); len(never) > 0 {
		cond.Status, cond.Reason = metav1.ConditionFalse, ngv1alpha1.ReasonWindowNeverOpens
		cond.Message = fmt.Sprintf("%s never fire(s): such a window never opens; fix its schedule", strings.Join(never, ", "))
	}
	return &cond
}
