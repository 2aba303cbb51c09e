// Package agentpools reads the upgrade settings of an AKS managed cluster's
// agent pools from Azure Resource Manager, for package upgrade to judge
// against the NodeDisruptionBudgets: a Poller lists the pools once at start
// and then every Interval, keeps the last good read, and says when the
// settings changed or a read started or stopped failing.
//
// It runs on every replica (the budget webhook reads it too), with a
// credential of the Azure configuration the admin-state client uses; it needs
// Microsoft.ContainerService/managedClusters/agentPools/read on the cluster.
//
// poller.go is the Poller and its ARM read; metrics.go its metrics.
package agentpools
