package finalizer

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// terminatingNodeChanged passes the node events a termination pass can act
// on: a node being deleted under the finalizer, and any change to one except
// a kubelet's (or kwok's) heartbeat and nodeguard's own condition write. Both
// recur for as long as the node drains, and a pass for each would find
// nothing new.
func terminatingNodeChanged() predicate.Predicate {
	return nodeChanged(func(*corev1.Node) bool { return false })
}

// nodeChanged is terminatingNodeChanged for the terminating nodes and those
// followed says the controller follows (follow.go).
func nodeChanged(followed func(*corev1.Node) bool) predicate.Predicate {
	watched := func(o client.Object) bool {
		if o == nil {
			return false
		}
		if ngv1alpha1.TerminatingUnderFinalizer(o) {
			return true
		}
		n, ok := o.(*corev1.Node)
		return ok && followed(n)
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return watched(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return watched(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return watched(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !watched(e.ObjectNew) {
				return false
			}
			old, ok1 := e.ObjectOld.(*corev1.Node)
			cur, ok2 := e.ObjectNew.(*corev1.Node)
			return !ok1 || !ok2 || !watched(old) || !watched(cur) || !sameButHeartbeat(old, cur)
		},
	}
}

// sameButHeartbeat reports whether two versions of a node differ in nothing
// but their resourceVersion and managed fields, the heartbeat times of their
// conditions and nodeguard's own Terminating condition; on a node it
// terminates, nodeguard's other conditions too: its passes wrote them, and
// read them from their memory before they are written (status.go).
func sameButHeartbeat(old, cur *corev1.Node) bool {
	if !equality.Semantic.DeepEqual(old.Spec, cur.Spec) ||
		!equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!equality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!slices.Equal(old.Finalizers, cur.Finalizers) ||
		!equality.Semantic.DeepEqual(old.DeletionTimestamp, cur.DeletionTimestamp) ||
		!equality.Semantic.DeepEqual(old.OwnerReferences, cur.OwnerReferences) {
		return false
	}
	oldStatus, curStatus := old.Status, cur.Status // shallow: only Conditions is replaced
	own := []corev1.NodeConditionType{ngv1alpha1.TerminatingCondition}
	if ngv1alpha1.TerminatingUnderFinalizer(cur) {
		own = append(own, ngv1alpha1.TrafficCutCondition, corev1.NodeDrainInProgress, corev1.NodeDrained)
	}
	oldStatus.Conditions, curStatus.Conditions = withoutHeartbeats(old.Status.Conditions, own), withoutHeartbeats(cur.Status.Conditions, own)
	return equality.Semantic.DeepEqual(oldStatus, curStatus)
}

// withoutHeartbeats copies the conditions without their heartbeat times and
// without the types own.
func withoutHeartbeats(conditions []corev1.NodeCondition, own []corev1.NodeConditionType) []corev1.NodeCondition {
	out := make([]corev1.NodeCondition, 0, len(conditions))
	for _, c := range conditions {
		if slices.Contains(own, c.Type) {
			continue
		}
		c.LastHeartbeatTime = metav1.Time{}
		out = append(out, c)
	}
	return out
}
