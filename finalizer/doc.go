// Package finalizer is the termination controller: it takes a node that was
// admitted for deletion (deletion timestamp plus the nodeguard.io/termination
// finalizer), holds its maintenance Lease, cordons and taints it, cuts its
// load-balancer traffic, drains its pods serially per PodDisruptionBudget
// (package drain), optionally waits for its volumes to detach, and only then
// removes the finalizer, which releases the node. Every phase is re-derived
// from the cluster on each pass, so a restart at any point resumes where the
// work stands.
//
// The files that matter:
//   - controller.go runs a pass, phases.go its phases in order, memory.go what
//     it remembers of each node (dropped whole when the node goes), watches.go
//     and nodechange.go what wakes a node;
//   - lease.go the maintenance Lease, traffic.go the traffic cut, slots.go the
//     drain slots (--max-concurrent-drains), drainpass.go the drain's pass,
//     podwatch.go the watch of a draining node's pods, replacement.go,
//     prefetch.go and rollout.go replacement first, gone.go a node whose VM is
//     gone, status.go and condition.go the node conditions it writes,
//     losses.go and events.go what it says;
//   - follow.go follows the drains nodeguard did not start (charged by the
//     eviction webhook), pickup.go finds those that began while it was not
//     answering, confirm.go withdraws a charge no eviction followed, and
//     givenup.go ends a drain its drainer gave up.
package finalizer
