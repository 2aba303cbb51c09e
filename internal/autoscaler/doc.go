// Package autoscaler makes cluster-autoscaler's scale-down honour
// NodeDisruptionBudgets and wait for nodeguard's traffic cut.
//
// cluster-autoscaler scales a node down in these steps (its
// core/scaledown/actuation): taint ToBeDeletedByClusterAutoscaler, evict the
// pods, wait up to --node-deletion-delay-timeout (2 min by default) until the
// node has no delay-deletion.cluster-autoscaler.kubernetes.io/* annotation,
// delete the VM; the cloud node lifecycle controller then deletes the Node.
// It decides whether to wait from the node as it was when it picked it, so a
// hold added after its taint is never waited for: nodeguard keeps its
// delay-deletion annotation on every managed node, and removes it only from a
// tainted node whose scale-down every budget admitted, once Azure confirmed
// the node's load-balancer entries Down (hold.go: HoldReconciler, which
// charges the scale-down by the deletion doors' budget.Rule). Past its wait,
// cluster-autoscaler deletes the VM anyway (it logs a warning): for an empty
// node a hold delays, it cannot refuse. A node with pods is refused all the
// same: the eviction webhook answers 429 to evictions from a tainted node
// until this hold lets its scale-down go (claimed, and its traffic cut), and
// cluster-autoscaler abandons a drain refused for --max-pod-eviction-time
// (evictions.go: ScaleDownHeld, which webhook/evictionwait.go asks).
//
// Before that, scaledown.go (ScaleDownReconciler) keeps cluster-autoscaler
// from picking a node a budget could not let go, with its
// scale-down-disabled annotation. setup.go wires both from cmd/nodeguard's
// options (--cluster-autoscaler-scale-down-hold); events.go and metrics.go
// name what they report.
package autoscaler
