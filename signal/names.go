// Package signal is nodeguard's taint watcher. It turns a node's signals into
// load-balancer admin state and into the spot-eviction taint:
//
//   - Watcher (leader only) watches Nodes and reacts only to changes of the
//     inputs of azure.DesiredState: the three signal taints, nodeguard's
//     draining taint, and deletion under nodeguard's finalizer. It hands a
//     node that must be Down to the admin-state manager at once, after
//     recording that nodeguard took it Down (AdminStateDownAnnotation). When
//     every signal is gone it restores None, but only on nodes carrying that
//     annotation, so nodeguard never overrides another tool's choice. Cordon
//     and other unschedulable signals are ignored on purpose.
//   - SpotTainter (leader only) turns the first PreemptScheduled event of a
//     node into the spot-eviction taint, with an optimistic-lock patch. The
//     taint is the durable record: later events and restarts add nothing.
//
// Setup wires both. Without Azure configuration only SpotTainter and the
// signal gauges run.
package signal

import (
	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Well-known names (an API: keep them stable). They belong with the others in
// api/v1alpha1/wellknown.go; they live here until that file takes them.
const (
	// AdminStateDownAnnotation (RFC 3339 time) marks a node whose
	// load-balancer entries nodeguard asked to be Down. nodeguard restores None
	// only on nodes carrying it, and removes it once Azure confirmed None.
	// Removing it by hand tells nodeguard to leave the node's entries alone
	// once its signals are gone.
	AdminStateDownAnnotation = "nodeguard.io/admin-state-down"

	// SpotEventHandledAnnotation (RFC 3339 time) records the creation time of
	// the newest PreemptScheduled event nodeguard turned into the
	// spot-eviction taint. Events created at or before it are never acted on
	// again, so a taint an operator removed stays removed across restarts.
	SpotEventHandledAnnotation = "nodeguard.io/spot-eviction-event-at"

	// PreemptScheduledReason is the reason of the event announcing that a
	// spot VM is about to be evicted.
	PreemptScheduledReason = "PreemptScheduled"
)

// SpotEvictionTaint is the taint a PreemptScheduled event becomes:
// cloudprovider.azure.microsoft.com/draining=spot-eviction:NoSchedule.
func SpotEvictionTaint() corev1.Taint {
	return corev1.Taint{Key: ngv1alpha1.SpotEvictionTaintKey, Value: ngv1alpha1.SpotEvictionTaintValue, Effect: corev1.TaintEffectNoSchedule}
}
