package v1alpha1

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSignalOf(t *testing.T) {
	tests := []struct {
		taint      corev1.Taint
		wantSignal string
	}{
		{corev1.Taint{Key: OutOfServiceTaintKey, Value: "nodeshutdown"}, "out_of_service"},
		{corev1.Taint{Key: CloudShutdownTaintKey}, "shutdown"},
		{corev1.Taint{Key: SpotEvictionTaintKey, Value: SpotEvictionTaintValue}, "spot_eviction"},
		{corev1.Taint{Key: SpotEvictionTaintKey, Value: "something-else"}, ""},
		{corev1.Taint{Key: DrainingTaintKey, Value: DrainingTaintValue}, ""},
		{corev1.Taint{Key: corev1.TaintNodeUnschedulable}, ""},
	}
	for _, tt := range tests {
		s, ok := SignalOf(tt.taint)
		if ok != (tt.wantSignal != "") || s.Signal != tt.wantSignal {
			t.Errorf("SignalOf(%s=%s) = %q, %v; want %q", tt.taint.Key, tt.taint.Value, s.Signal, ok, tt.wantSignal)
		}
	}
}

func TestTerminatingUnderFinalizer(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		meta metav1.ObjectMeta
		want bool
	}{
		{"deleting with our finalizer", metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{"other", TerminationFinalizer}}, true},
		{"deleting with another finalizer", metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{"other"}}, false},
		{"not deleting", metav1.ObjectMeta{Finalizers: []string{TerminationFinalizer}}, false},
	}
	for _, tt := range tests {
		if got := TerminatingUnderFinalizer(&corev1.Node{ObjectMeta: tt.meta}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestTimeAnnotationsRoundTripAndReadOlderValues(t *testing.T) {
	at := time.Date(2026, 11, 23, 5, 6, 7, 891011121, time.FixedZone("x", 3600))
	got, err := ParseTime(FormatTime(at))
	if err != nil || !got.Equal(at) {
		t.Errorf("round trip of %s = %s, %v", at, got, err)
	}
	if got, err := ParseTime("2026-11-23T05:06:07Z"); err != nil || !got.Equal(time.Date(2026, 11, 23, 5, 6, 7, 0, time.UTC)) {
		t.Errorf("plain RFC 3339 = %s, %v", got, err)
	}
}
