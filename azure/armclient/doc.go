// Package armclient is nodeguard's Azure Resource Manager client for load
// balancers, backend address pools and NICs: the armnetwork SDK clients with a
// throttling gate (429 → *ThrottleError), If-Match on pool writes, polling of
// long-running writes to completion, and a metrics wrapper.
//
// client.go holds the client and its calls on pools and NICs; lean.go the
// load balancer lists of discovery and verification, which decode only what
// they read (entries' names, IPs, admin states, NIC configurations);
// throttle.go the throttling gate; vms.go a node's VM (its ID from the
// providerID, whether it exists); metrics.go the metrics wrapper
// (WithMetrics).
package armclient
