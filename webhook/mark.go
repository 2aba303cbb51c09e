package webhook

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// finalizerAddedHold is how long after nodeguard added its finalizer to an
// existing node deletes are denied. kube-apiserver re-runs delete admission at
// once when the node changed during the request (storage/etcd3
// conditionalDelete), so a few seconds cover it with room for clock skew
// between webhook replicas.
const finalizerAddedHold = 3 * time.Second

// markFinalizerAdded adds the finalizer and records when.
func markFinalizerAdded(node *corev1.Node, now time.Time) {
	node.Finalizers = append(node.Finalizers, ngv1alpha1.TerminationFinalizer)
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation] = ngv1alpha1.FormatTime(now)
}

// finalizerJustAdded returns when nodeguard added its finalizer to the node,
// and whether that is within finalizerAddedHold of now. An unreadable mark
// counts as fresh: denying once more is safe, deleting unguarded is not.
func finalizerJustAdded(node *corev1.Node, now time.Time) (time.Time, bool) {
	value, ok := node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
	if !ok {
		return time.Time{}, false
	}
	addedAt, err := ngv1alpha1.ParseTime(value)
	if err != nil {
		return now, true
	}
	return addedAt, now.Before(addedAt.Add(finalizerAddedHold))
}
