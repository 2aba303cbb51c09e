package finalizer

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// A drain another writer started can end without the node coming back: its
// drainer gives up and says so. An AKS upgrade with undrainableNodeBehavior
// Cordon labels a node it could not drain within its drain timeout
// kubernetes.azure.com/upgrade-status=Quarantined and goes on, leaving it
// cordoned with its pods running; a KEP-5683 drainer sets its DrainInProgress
// False (or removes it) without Drained=True. Kept charged, such a node would
// take no new connections while its pods still serve, and hold its budgets'
// room for the rest of the upgrade: with a budget of one, one undrainable pod
// would fail the upgrade of the whole pool. So the drain ends: its disruption
// is given back, its marks removed (the taint watcher restores None), and the
// node is marked nodeguard.io/drain-given-up-at. While that mark stands (until
// the node is schedulable again), the quarantine label ends no later drain,
// and no drain is picked up on the node without an eviction: a later drain is
// charged anew at its first eviction, and only its drainer's uncordon (or a
// DrainInProgress it sets False) ends it.

// ReasonDrainGivenUp (Node, Warning): the drainer gave up the drain; its
// disruption was given back and the node's traffic restored.
const ReasonDrainGivenUp = "DrainGivenUp"

// LifecycleReasonGivenUp: the drain's conditions end because its drainer gave up.
const LifecycleReasonGivenUp = "DrainGivenUp"

// Why a drain was given up, the values of drains_given_up_total's label.
const (
	givenUpQuarantined    = "quarantined"
	givenUpDrainCondition = "drain_condition"
)

var drainsGivenUp = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nodeguard_drains_given_up_total",
	Help: "Charged drains of other drainers that ended because the drainer gave up, by why: quarantined (an AKS upgrade's kubernetes.azure.com/upgrade-status=Quarantined), drain_condition (the drainer's DrainInProgress set False or removed without Drained). The disruption was given back and the traffic restored.",
}, []string{"reason"})

func init() { metrics.Registry.MustRegister(drainsGivenUp) }

// drainerGaveUp says why the charged node's drainer gave its drain up, and
// the reason's label; "" when it did not.
func drainerGaveUp(node *corev1.Node) (why, reason string) {
	_, marked := node.Annotations[ngv1alpha1.DrainGivenUpAtAnnotation]
	if node.Labels[ngv1alpha1.UpgradeStatusLabel] == ngv1alpha1.UpgradeQuarantined && !marked {
		return fmt.Sprintf("an AKS upgrade could not drain it within its drain timeout and quarantined it (%s=%s): the node stays cordoned with its pods",
			ngv1alpha1.UpgradeStatusLabel, ngv1alpha1.UpgradeQuarantined), givenUpQuarantined
	}
	if _, seen := node.Annotations[ngv1alpha1.DrainConditionSeenAtAnnotation]; seen && !ngv1alpha1.DrainInProgressByOther(node) {
		if c := nodeCondition(node, corev1.NodeDrained); c == nil || c.Status != corev1.ConditionTrue {
			return "its drainer set its DrainInProgress condition False or removed it, without Drained=True", givenUpDrainCondition
		}
	}
	return "", ""
}

// giveUp ends a drain its drainer gave up: conditions, marks and charge as an
// uncordon ends one, and the given-up mark in the same write.
func (r *Reconciler) giveUp(ctx context.Context, node *corev1.Node, by, why, reason string) (reconcile.Result, error) {
	mark := map[string]string{ngv1alpha1.DrainGivenUpAtAnnotation: ngv1alpha1.FormatTime(r.Clock.Now())}
	names, err := r.closeDrain(ctx, node, LifecycleReasonGivenUp, "the drainer gave up: "+why, mark)
	if err != nil {
		return reconcile.Result{}, err
	}
	drainsGivenUp.WithLabelValues(reason).Inc()
	r.event(node, corev1.EventTypeWarning, ReasonDrainGivenUp,
		"the drain by %s was given up: %s; gave the disruption back to NodeDisruptionBudget(s) [%s] and restoring load-balancer traffic; a later drain is charged again at its first eviction",
		by, why, strings.Join(names, ", "))
	r.forget(ctx, node.UID)
	return reconcile.Result{}, nil
}

// noteDrainCondition records that the charged node's drain is signalled by
// another writer's DrainInProgress=True, once: that writer removing it later
// is its word that it gave up (drainerGaveUp).
func (r *Reconciler) noteDrainCondition(ctx context.Context, node *corev1.Node, by string) error {
	if _, seen := node.Annotations[ngv1alpha1.DrainConditionSeenAtAnnotation]; seen || !signalledByOther(node, by) {
		return nil
	}
	return r.annotate(ctx, node, ngv1alpha1.DrainConditionSeenAtAnnotation, ngv1alpha1.FormatTime(r.Clock.Now()))
}

// givenUpMarked reports a node whose last drain its drainer gave up.
func givenUpMarked(node *corev1.Node) bool {
	_, marked := node.Annotations[ngv1alpha1.DrainGivenUpAtAnnotation]
	return marked
}

// afterGiveUp handles an uncharged node marked given up: the mark goes once
// the node is schedulable again; until then no drain is picked up on it
// without an eviction (the evictions the drainer sent before it gave up may
// still be terminating, and would charge it again at once).
func (r *Reconciler) afterGiveUp(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if ngv1alpha1.Cordoned(node) {
		return reconcile.Result{}, nil
	}
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, ngv1alpha1.DrainGivenUpAtAnnotation))
	if err := r.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("removing the given-up mark of node %s: %w", node.Name, err))
	}
	r.forget(ctx, node.UID)
	return reconcile.Result{}, nil
}

// annotate sets one of nodeguard's annotations on the node (and on the copy
// in hand), with a merge patch that leaves every other field to its writer.
func (r *Reconciler) annotate(ctx context.Context, node *corev1.Node, key, value string) error {
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, key, value))
	if err := r.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, patch); err != nil {
		return fmt.Errorf("annotating node %s with %s: %w", node.Name, key, err)
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[key] = value
	return nil
}
