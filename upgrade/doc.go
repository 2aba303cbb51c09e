// Package upgrade is what nodeguard knows of AKS upgrades: an agent pool's
// upgrade settings, how many of its nodes an upgrade drains at once, and
// whether the settings and a NodeDisruptionBudget can both hold (an upgrade
// that waits on the budget longer than its drain timeout fails the node).
// The settings are read from Azure Resource Manager (azure/agentpools); this
// package only judges them, so the budget controller, the budget webhook and
// the kubectl plugin judge alike.
//
// settings.go holds an agent pool's Settings and where they come from
// (Source), the drains an upgrade runs at once (ConcurrentDrains), and the
// judgement of the settings against a budget (Judge).
package upgrade
