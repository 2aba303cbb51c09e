// Package azure sets the Azure Load Balancer backend admin state of nodes:
// Down while a node is leaving service, None otherwise. A Manager keeps the
// desired state per node (keyed by UID), and its workers apply it per backend
// pool: lock, fresh Get, set AdminState on every entry whose node's desired
// state differs, and at most one CreateOrUpdate with If-Match. Errors are
// classified as in the backend pool updater design: 404 is stale (dropped
// quietly), 429 parks the pool until Retry-After, 409/412 and a canceled
// long-running write retry after a fresh Get, everything else is terminal.
//
// Sub-packages: config (azure.json, flags, credentials), armclient (the ARM
// client, throttling gate and call metrics) and backends (node → entries).
package azure

import (
	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// AdminState is a backend entry's administrative state as nodeguard sets it.
type AdminState string

const (
	// AdminStateNone lets health probes decide (the normal state).
	AdminStateNone AdminState = "None"
	// AdminStateDown stops new connections to the node.
	AdminStateDown AdminState = "Down"
)

// DesiredState is the one place that decides a node's admin state: Down while
// it carries a signal taint (out-of-service, cloud shutdown, spot eviction)
// or nodeguard's draining taint, or is being deleted while nodeguard's
// finalizer holds it; None otherwise.
func DesiredState(node *corev1.Node) AdminState {
	if node == nil {
		return AdminStateNone
	}
	for _, t := range node.Spec.Taints {
		if _, signal := ngv1alpha1.SignalOf(t); signal || ngv1alpha1.IsDrainingTaint(t) {
			return AdminStateDown
		}
	}
	if ngv1alpha1.TerminatingUnderFinalizer(node) {
		return AdminStateDown
	}
	return AdminStateNone
}
