// Package taintwatch is nodeguard's taint watcher. It turns a node's signals
// into load-balancer admin state and into the spot-eviction taint:
//
//   - Watcher (leader only) watches Nodes and reacts only to changes of the
//     inputs of azure.Signals.DesiredState: the signal taints
//     (--signal-taints), nodeguard's draining taint, deletion under
//     nodeguard's finalizer, and someone else's drain charged
//     (ngv1alpha1.DrainCharged). It hands a node that must be Down to the
//     admin-state manager at once, after recording that nodeguard took it
//     Down (ngv1alpha1.AdminStateDownAnnotation; not on a node being
//     deleted, which is never restored while it exists). When every signal
//     is gone it restores None, but only on nodes carrying that annotation,
//     so nodeguard never overrides another tool's choice. Cordon and other
//     unschedulable signals are ignored on purpose.
//   - SpotTainter (leader only) turns the first trusted PreemptScheduled
//     event of a spot node into the spot-eviction taint, with an
//     optimistic-lock patch, and takes the taint off again when the node
//     outlives the notice. The taint is the durable record: later events and
//     restarts add nothing.
//
// Setup wires both. Without Azure configuration only SpotTainter and the
// signal gauges run.
//
// watcher.go is the Watcher; signals.go a node's signals, as the gauges name
// them, and the inputs of its desired state; spot.go the SpotTainter, with
// names.go the names of the spot-eviction event and taint; services.go the
// LoadBalancer Service changes that bring the admin-state manager's
// verification forward; setup.go the flags and Setup; events.go and
// metrics.go.
package taintwatch
