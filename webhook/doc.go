// Package webhook is nodeguard's admission: the doors through which a node's
// disruption is asked for, each deciding by the one rule built at start-up
// (budget.Rules), and the termination finalizer that guards a node's delete.
// Every replica serves the webhooks (setup.go: Register; SetupLeader adds
// what the leader runs beside them).
//
// The doors:
//
//   - delete.go: Node DELETE. A node not yet guarded by the finalizer gets it
//     and the delete is retried (mark.go); a node Karpenter terminates is let
//     go; otherwise the deletion rule decides, and warnings.go tells an
//     admitted delete what its drain will meet.
//   - nodeclaim.go: Karpenter's NodeClaim DELETE, decided by the same rule,
//     with the marks of package karpenter's release.
//   - eviction.go: someone else's drain, seen at its evictions (the pod's node
//     from podnodes.go): the first eviction from a cordoned node charges the
//     node's budgets by the drain rule and marks the node (evictioncharge.go);
//     evictions wait for the node's traffic cut or for a cluster-autoscaler
//     scale-down's claim (evictionwait.go, asking internal/autoscaler).
//
// What the doors share: decision.go, a door's decision, the one translation of
// the rule's verdict into it, and its admission response; events.go, the
// events' reasons and the doors' one event emitter; metrics.go.
//
// Beside them: finalizer.go and backfill.go keep the termination finalizer on
// every managed node; budget.go refuses a NodeDisruptionBudget whose spec the
// doors could not evaluate; scope.go checks the webhooks' objectSelector
// against --node-selector; flags.go and readiness.go are the webhook server's
// settings and a replica's readiness; decode.go reads a review's Node.
package webhook
