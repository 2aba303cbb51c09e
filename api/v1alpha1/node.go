package v1alpha1

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The rules about nodes that several parts of nodeguard apply. Each is written
// once, here, so that the budget, the admin state, the taint watcher and the
// termination never disagree.

// SignalTaint is a taint that says a node is leaving or has gone: while a node
// carries one, its load-balancer traffic is cut and budgets count it
// unavailable.
// +kubebuilder:object:generate=false
type SignalTaint struct {
	Key string
	// Value, when set, is the only value that counts.
	Value string
	// Signal names it in metrics and events.
	Signal string
}

// SignalTaints are the signal taints, in the order metrics list them.
var SignalTaints = []SignalTaint{
	{Key: OutOfServiceTaintKey, Signal: "out_of_service"},
	{Key: CloudShutdownTaintKey, Signal: "shutdown"},
	{Key: SpotEvictionTaintKey, Value: SpotEvictionTaintValue, Signal: "spot_eviction"},
}

// Matches reports whether a taint is this signal taint.
func (s SignalTaint) Matches(t corev1.Taint) bool {
	return t.Key == s.Key && (s.Value == "" || t.Value == s.Value)
}

// SignalOf returns the signal taint that a taint is, if it is one.
func SignalOf(t corev1.Taint) (SignalTaint, bool) {
	for _, s := range SignalTaints {
		if s.Matches(t) {
			return s, true
		}
	}
	return SignalTaint{}, false
}

// IsDrainingTaint reports whether a taint is nodeguard's draining taint.
func IsDrainingTaint(t corev1.Taint) bool { return t.Key == DrainingTaintKey }

// TerminatingUnderFinalizer reports whether an object is being deleted while
// nodeguard's termination finalizer holds it.
func TerminatingUnderFinalizer(obj metav1.Object) bool {
	return obj.GetDeletionTimestamp() != nil && slices.Contains(obj.GetFinalizers(), TerminationFinalizer)
}

// FormatTime formats a time for nodeguard's time annotations (RFC 3339 with
// nanoseconds, UTC).
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ParseTime parses a time annotation; plain RFC 3339 (no fraction), as older
// nodeguard versions wrote, parses too.
func ParseTime(s string) (time.Time, error) { return time.Parse(time.RFC3339Nano, s) }
