package finalizer

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/kube/nodepatch"
)

// cordonPatch sets the node unschedulable and appends the draining taint,
// provided its taints are still those of node.
func cordonPatch(node *corev1.Node, draining corev1.Taint) []nodepatch.Op {
	var taints any // null: no taints yet
	if len(node.Spec.Taints) > 0 {
		taints = node.Spec.Taints
	}
	return []nodepatch.Op{
		nodepatch.Test("/spec/taints", taints),
		nodepatch.Add("/spec/taints", append(slices.Clone(node.Spec.Taints), draining)),
		nodepatch.Add("/spec/unschedulable", true),
	}
}

// finalizerRemoval removes the finalizer at index i, provided it is still
// nodeguard's: another controller's finalizer, removed meanwhile, is never
// lost.
func finalizerRemoval(i int) []nodepatch.Op {
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	return []nodepatch.Op{
		nodepatch.Test(path, ngv1alpha1.TerminationFinalizer),
		nodepatch.Remove(path),
	}
}
