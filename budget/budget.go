// Package budget decides whether a node may be disrupted now, against the
// NodeDisruptionBudgets that select it, and keeps their status:
//
//   - rule.go: Rule, the one decision every door calls (an instance gone,
//     a maintenance Lease hold, the budgets, a dry run); the order of its
//     checks lives there only;
//   - budget.go: which nodes a budget selects, which of them are unavailable,
//     and how many more may be disrupted (Evaluate); window.go its
//     disruption windows; maintenance.go the maintenance Lease holds;
//   - charge.go: the budgets selecting a node, charged all or none, and given
//     back; claim.go: the conditional status write that admits one node
//     against one budget (Claimer), with commit.go its group commit, apply.go
//     a round's changes applied in order, and prune.go when a claim may leave
//     status.disruptedNodes;
//   - status.go: the status controller, with condition.go its conditions,
//     warnings.go its Warning events, upgrade.go the judgement of the AKS
//     upgrade settings (status.agentPools, UpgradeSettingsFit) and nodes.go
//     the cached nodes it reads; events.go and metrics.go.
package budget

import (
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Unavailable reports whether a node counts as unavailable for budgets: it is
// not Ready, is being deleted, carries a signal taint or the draining taint, or
// someone else's drain of it was charged (until it is schedulable and Ready).
// The autoscalers' taints count only once the disruption is charged
// (ngv1alpha1.Signals.AwaitsDisruptionClaim). signals is the configured
// table (nil: the defaults). It returns a short reason for events and
// messages.
func Unavailable(node *corev1.Node, signals *ngv1alpha1.Signals) (bool, string) {
	if node.DeletionTimestamp != nil {
		return true, "deleting"
	}
	for _, t := range node.Spec.Taints {
		if ngv1alpha1.IsDrainingTaint(t) {
			return true, "draining"
		}
		if _, signal := signals.Of(t); signal && !signals.AwaitsDisruptionClaim(node, t) {
			return true, "tainted " + t.Key
		}
	}
	if ngv1alpha1.ScaleDownClaimed(node) {
		return true, "scaled down by cluster-autoscaler"
	}
	if by, charged := ngv1alpha1.DrainCharged(node); charged {
		return true, "drained by " + by
	}
	if ngv1alpha1.Ready(node) {
		return false, ""
	}
	return true, "not ready"
}

// Selector converts the budget's label selector. A nil selector selects
// nothing; an empty one selects every node. An invalid one (stored before the
// CRD refused it) is an *InvalidSelectorError.
func Selector(ndb *ngv1alpha1.NodeDisruptionBudget) (labels.Selector, error) {
	return specSelector(&ndb.Spec)
}

func specSelector(spec *ngv1alpha1.NodeDisruptionBudgetSpec) (labels.Selector, error) {
	if spec.Selector == nil {
		return labels.Nothing(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil {
		return nil, &InvalidSelectorError{Err: err}
	}
	return sel, nil
}

// InvalidSelectorError is a budget selector that cannot be evaluated: the
// budget selects no node.
type InvalidSelectorError struct{ Err error }

func (e *InvalidSelectorError) Error() string { return "spec.selector: " + e.Err.Error() }
func (e *InvalidSelectorError) Unwrap() error { return e.Err }

// Selects reports whether the budget covers the node.
func Selects(ndb *ngv1alpha1.NodeDisruptionBudget, node *corev1.Node) (bool, error) {
	sel, err := Selector(ndb)
	if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(node.Labels)), nil
}

// desiredAvailable is how many of expected nodes the budget wants available at
// now, taking the tightest active window into account.
func desiredAvailable(spec *ngv1alpha1.NodeDisruptionBudgetSpec, expected int32, now time.Time) (int32, *ActiveWindow, error) {
	var desired int32
	switch {
	case spec.MinAvailable != nil:
		minAvailable, err := scaled(spec.MinAvailable, expected)
		if err != nil {
			return 0, nil, fmt.Errorf("minAvailable: %w", err)
		}
		desired = minAvailable
	case spec.MaxUnavailable != nil:
		maxUnavailable, err := scaled(spec.MaxUnavailable, expected)
		if err != nil {
			return 0, nil, fmt.Errorf("maxUnavailable: %w", err)
		}
		desired = max(expected-maxUnavailable, 0)
	default:
		return 0, nil, fmt.Errorf("neither minAvailable nor maxUnavailable is set")
	}
	window, err := activeWindow(spec.Windows, expected, now)
	if err != nil || window == nil {
		return desired, nil, err
	}
	if windowDesired := max(expected-window.MaxUnavailable, 0); windowDesired > desired {
		return windowDesired, window, nil
	}
	return desired, nil, nil
}

// scaled resolves an integer or a percentage of total, rounding percentages up
// as PodDisruptionBudgets do.
func scaled(v *intstr.IntOrString, total int32) (int32, error) {
	n, err := intstr.GetScaledValueFromIntOrPercent(v, int(total), true)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > math.MaxInt32 {
		return 0, fmt.Errorf("value %s out of range", v.String())
	}
	return int32(n), nil
}

// Numbers are a budget's counts at one moment.
type Numbers struct {
	Expected, Available, Desired, Allowed int32
	// Window is the disruption window that tightened the budget, if any.
	Window *ActiveWindow
}

// Evaluate computes a budget's numbers from the nodes it selects. A node with
// an entry in disruptedNodes is not counted as available even before it is seen
// unavailable: its disruption is already charged to the budget.
func Evaluate(ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, signals *ngv1alpha1.Signals, now time.Time) (Numbers, error) {
	n := Numbers{Expected: int32(len(selected))}
	for _, node := range selected {
		unavailable, _ := Unavailable(node, signals)
		if _, charged := ndb.Status.DisruptedNodes[node.Name]; !unavailable && !charged {
			n.Available++
		}
	}
	return n.withDesired(&ndb.Spec, now)
}

// FromStatus recomputes a budget's numbers from its status at now, so that a
// window that opened after the status was written applies at once.
func FromStatus(ndb *ngv1alpha1.NodeDisruptionBudget, now time.Time) (Numbers, error) {
	n := Numbers{Expected: ndb.Status.ExpectedNodes, Available: ndb.Status.CurrentAvailable}
	return n.withDesired(&ndb.Spec, now)
}

func (n Numbers) withDesired(spec *ngv1alpha1.NodeDisruptionBudgetSpec, now time.Time) (Numbers, error) {
	if _, err := specSelector(spec); err != nil {
		return n, err // it selected nothing: the numbers are not the budget's
	}
	desired, window, err := desiredAvailable(spec, n.Expected, now)
	if err != nil {
		return n, err
	}
	n.Desired, n.Window = desired, window
	n.Allowed = max(n.Available-n.Desired, 0)
	return n, nil
}

// Unavailable is how many selected nodes are unavailable or already charged.
func (n Numbers) Unavailable() int32 { return n.Expected - n.Available }

// MaxUnavailable is how many selected nodes may be unavailable at once.
func (n Numbers) MaxUnavailable() int32 { return max(n.Expected-n.Desired, 0) }

// String renders the numbers for messages: "allowed 0, unavailable 2 of max 2".
func (n Numbers) String() string {
	return fmt.Sprintf("allowed %d, unavailable %d of max %d", n.Allowed, n.Unavailable(), n.MaxUnavailable())
}
