package taintwatch

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/test/harness"
)

var draining = corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule}

// TestNoneWaitsForEverySignalEitherWriterHonours: nodeguard never restores
// None while a node carries a signal taint that it or cloud-provider-azure
// (whose design sets Down for out-of-service, shutdown and spot eviction)
// honours. With --signal-admin-state=cloud-provider, nodeguard leaves the
// signal taints to the cloud provider and cuts only for its own drain; with
// nodeguard's default it holds even a provider taint that --signal-taints
// leaves out.
func TestNoneWaitsForEverySignalEitherWriterHonours(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	tests := []struct {
		name         string
		mode         azure.SignalAdminState
		signalTaints []ngv1alpha1.SignalTaint
		node         testNode
	}{
		{name: "cloud-provider handles the signals", mode: azure.SignalByCloudProvider, signalTaints: ngv1alpha1.DefaultSignalTaints, node: vmssNode("ho-cp", 0)},
		{name: "nodeguard, out-of-service not among its signal taints", mode: azure.SignalByNodeguard, signalTaints: ngv1alpha1.DefaultSignalTaints[3:], node: vmssNode("ho-ng", 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			emu := startEmulator(t, tt.node)
			createNode(t, tt.node)
			startNodeguard(t, emu, nodeguardOptions{maxRetries: 3,
				signals: azure.Signals{Table: ngv1alpha1.NewSignals(tt.signalTaints, true), Mode: tt.mode}})

			passes := reconciles(t, "signal-taint-watcher")
			updateTaints(t, tt.node.name, withTaint(outOfService))
			harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
				return reconciles(t, "signal-taint-watcher") > passes, nil
			}, "the watcher sees the out-of-service taint")
			wantEntries(t, emu, tt.node.name, "None") // not nodeguard's to set: the provider's, or not a signal
			if got := puts(emu); got != 0 {
				t.Errorf("%d pool writes for a signal nodeguard does not handle, want 0", got)
			}

			updateTaints(t, tt.node.name, withTaint(draining))
			waitEntries(t, emu, tt.node.name, "Down")

			passes = reconciles(t, "signal-taint-watcher")
			restores := testutil.ToFloat64(adminStateRequests.WithLabelValues(string(azure.AdminStateNone)))
			updateTaints(t, tt.node.name, withoutTaint(draining.Key))
			harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
				return reconciles(t, "signal-taint-watcher") > passes, nil
			}, "the watcher sees the draining taint go")
			if got := testutil.ToFloat64(adminStateRequests.WithLabelValues(string(azure.AdminStateNone))); got != restores {
				t.Errorf("None was requested while the out-of-service taint is on")
			}
			wantEntries(t, emu, tt.node.name, "Down")
			if !heldDown(getNode(t, tt.node.name)) {
				t.Errorf("node %s released while the out-of-service taint is on", tt.node.name)
			}

			updateTaints(t, tt.node.name, withoutTaint(outOfService.Key))
			waitEntries(t, emu, tt.node.name, "None")
		})
	}
}
