// Package karpenter holds what nodeguard knows of Karpenter (and AKS node
// auto-provisioning), which disrupts a node by deleting its NodeClaim:
//
//   - the facts read from a node and its NodeClaim (nodeclaim.go): who owns the
//     node, whether Karpenter already terminates it;
//   - the marks the NodeClaim webhook leaves on a node (marks.go): a charged
//     NodeClaim delete, a denied one;
//   - the release of a node whose NodeClaim delete stays denied (release.go).
//
// The NodeClaim DELETE door is webhook/nodeclaim.go (it calls the one
// budget rule, as every door does), and the termination controller's phase
// for a node Karpenter drains itself is finalizer/karpenter.go. Both ask this
// package, which imports only the API, so it sits below them both.
package karpenter
