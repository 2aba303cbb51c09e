package azure

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

func TestDesiredState(t *testing.T) {
	now := metav1.Now()
	taint := func(k, v string) corev1.Taint {
		return corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffectNoSchedule}
	}
	tests := []struct {
		name       string
		taints     []corev1.Taint
		deleting   bool
		finalizers []string
		want       AdminState
	}{
		{name: "plain node", want: AdminStateNone},
		{name: "cordoned only", taints: []corev1.Taint{taint(corev1.TaintNodeUnschedulable, "")}, want: AdminStateNone},
		{name: "out-of-service", taints: []corev1.Taint{taint(ngv1alpha1.OutOfServiceTaintKey, "nodeshutdown")}, want: AdminStateDown},
		{name: "cloud shutdown", taints: []corev1.Taint{taint(ngv1alpha1.CloudShutdownTaintKey, "")}, want: AdminStateDown},
		{name: "spot eviction", taints: []corev1.Taint{taint(ngv1alpha1.SpotEvictionTaintKey, ngv1alpha1.SpotEvictionTaintValue)}, want: AdminStateDown},
		{name: "azure draining taint with another value", taints: []corev1.Taint{taint(ngv1alpha1.SpotEvictionTaintKey, "other")}, want: AdminStateNone},
		{name: "nodeguard draining", taints: []corev1.Taint{taint(ngv1alpha1.DrainingTaintKey, ngv1alpha1.DrainingTaintValue)}, want: AdminStateDown},
		{name: "deleting with our finalizer", deleting: true, finalizers: []string{"other", ngv1alpha1.TerminationFinalizer}, want: AdminStateDown},
		{name: "deleting without our finalizer", deleting: true, finalizers: []string{"other"}, want: AdminStateNone},
		{name: "our finalizer, not deleting", finalizers: []string{ngv1alpha1.TerminationFinalizer}, want: AdminStateNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Finalizers: tt.finalizers}, Spec: corev1.NodeSpec{Taints: tt.taints}}
			if tt.deleting {
				n.DeletionTimestamp = &now
			}
			if got := (Signals{}).DesiredState(n); got != tt.want {
				t.Errorf("DesiredState = %s, want %s", got, tt.want)
			}
		})
	}
	if got := (Signals{}).DesiredState(nil); got != AdminStateNone {
		t.Errorf("DesiredState(nil) = %s", got)
	}
}

// TestDesiredStateWithCloudProviderSignals: with --signal-admin-state=cloud-provider
// the signal taints are the provider's to act on; nodeguard's own drain
// still cuts, and every taint either side honours holds the state.
func TestDesiredStateWithCloudProviderSignals(t *testing.T) {
	cloud := Signals{Mode: SignalByCloudProvider}
	now := metav1.Now()
	oos := corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	tainted := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{oos}}}
	if got := cloud.DesiredState(tainted); got != AdminStateNone {
		t.Errorf("out-of-service with cloud-provider signals: DesiredState = %s, want None (the provider sets Down)", got)
	}
	if !cloud.Table.HoldsAdminState(tainted) {
		t.Error("out-of-service must hold the state: the provider restores None only once it is gone")
	}
	draining := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue}}}}
	deleting := &corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{ngv1alpha1.TerminationFinalizer}}}
	for _, n := range []*corev1.Node{draining, deleting} {
		if got := cloud.DesiredState(n); got != AdminStateDown {
			t.Errorf("nodeguard's own drain with cloud-provider signals: DesiredState = %s, want Down", got)
		}
	}
	if _, err := ParseSignalAdminState("azure"); err == nil {
		t.Error("ParseSignalAdminState accepted an unknown value")
	}
}
