package taintwatch

import (
	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

const (
	// PreemptScheduledReason is the reason of the event announcing that a
	// spot VM is about to be evicted.
	PreemptScheduledReason = "PreemptScheduled"

	// DefaultSpotEventNamespace and DefaultSpotEventComponent are where and
	// by whom AKS writes that event: node-problem-detector, run by the AKS
	// node extension on every node with the kubelet's credentials, from its
	// custom plugin monitor of that name (see spot.go). It sets no
	// --event-namespace, so client-go's recorder puts a Node's events in
	// "default".
	DefaultSpotEventNamespace = "default"
	DefaultSpotEventComponent = "custom-scheduledevents-consolidated-preempt-plugin-monitor"

	// imdsFailedPrefix starts the message of the PreemptScheduled event that
	// node-problem-detector writes when its plugin could not ask IMDS (a
	// temporary rule reports every non-OK exit): no notice at all.
	imdsFailedPrefix = "IMDS query failed"
)

// SpotEvictionTaint is the taint a PreemptScheduled event becomes:
// cloudprovider.azure.microsoft.com/draining=spot-eviction:NoSchedule.
func SpotEvictionTaint() corev1.Taint {
	return corev1.Taint{Key: ngv1alpha1.SpotEvictionTaintKey, Value: ngv1alpha1.SpotEvictionTaintValue, Effect: corev1.TaintEffectNoSchedule}
}
