package webhook

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// InstanceChecker says whether a node's cloud instance still exists (on
// Azure: the VM named by its providerID). cmd/nodeguard passes the Azure
// admin-state manager; without Azure there is none.
type InstanceChecker interface {
	InstanceExists(ctx context.Context, node *corev1.Node) (bool, error)
}

// instanceGone reports whether a node that is not Ready has no instance any
// more: the cloud node lifecycle controller deletes exactly such nodes, every
// 5 s, and must never be refused (the node has nothing left to protect, and
// the pod garbage collector waits for it to go). A node that is Ready is not
// asked about; an error counts as "exists" (the usual rules apply).
func instanceGone(ctx context.Context, checker InstanceChecker, node *corev1.Node) bool {
	if checker == nil || ready(node) {
		return false
	}
	exists, err := checker.InstanceExists(ctx, node)
	if err != nil {
		logf.FromContext(ctx).Error(err, "Asking whether the node's instance exists; deciding as if it does", "node", node.Name)
		return false
	}
	return !exists
}

func ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
