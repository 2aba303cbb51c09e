package v1alpha1

import (
	"reflect"
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
		{corev1.Taint{Key: ClusterAutoscalerTaintKey, Value: "1700000000"}, "cluster_autoscaler"},
		{corev1.Taint{Key: KarpenterDisruptedTaintKey}, "karpenter_disrupted"},
		{corev1.Taint{Key: DrainingTaintKey, Value: DrainingTaintValue}, ""},
		{corev1.Taint{Key: corev1.TaintNodeUnschedulable}, ""},
	}
	for _, tt := range tests {
		s, ok := (*Signals)(nil).Of(tt.taint)
		if ok != (tt.wantSignal != "") || s.Signal != tt.wantSignal {
			t.Errorf("Of(%s=%s) = %q, %v; want %q", tt.taint.Key, tt.taint.Value, s.Signal, ok, tt.wantSignal)
		}
	}
}

func TestParseSignalTaints(t *testing.T) {
	got, err := ParseSignalTaints(FormatSignalTaints(DefaultSignalTaints))
	if err != nil || !reflect.DeepEqual(got, DefaultSignalTaints) {
		t.Errorf("the default does not round-trip: %v, %v", got, err)
	}
	got, err = ParseSignalTaints(" example.com/leaving=yes, " + OutOfServiceTaintKey)
	want := []SignalTaint{
		{Key: "example.com/leaving", Value: "yes", Signal: "example.com/leaving"},
		{Key: OutOfServiceTaintKey, Signal: "out_of_service"},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if got, err := ParseSignalTaints(""); err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v; want none", got, err)
	}
	for _, bad := range []string{"a,,b", "=v", "bad key", "k=bad value", "k,k=v", "example.com/"} {
		if _, err := ParseSignalTaints(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestConfiguredSignalTaintsReplaceTheDefaults(t *testing.T) {
	custom, err := ParseSignalTaints("example.com/leaving")
	if err != nil {
		t.Fatal(err)
	}
	signals := NewSignals(custom, true)
	if _, ok := signals.Of(corev1.Taint{Key: ClusterAutoscalerTaintKey}); ok {
		t.Error("a default signal taint still counts after it was configured away")
	}
	if s, ok := signals.Of(corev1.Taint{Key: "example.com/leaving", Value: "any"}); !ok || s.Signal != "example.com/leaving" {
		t.Errorf("configured taint: %v, %v", s, ok)
	}
	if _, ok := (*Signals)(nil).Of(corev1.Taint{Key: ClusterAutoscalerTaintKey}); !ok {
		t.Error("another component's signals (the defaults) changed with this one's")
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

func withReady(status corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: status}}}}
}

func TestReady(t *testing.T) {
	if !Ready(withReady(corev1.ConditionTrue)) {
		t.Error("a node Ready=True is not Ready")
	}
	for _, s := range []corev1.ConditionStatus{corev1.ConditionFalse, corev1.ConditionUnknown} {
		if Ready(withReady(s)) {
			t.Errorf("a node Ready=%s is Ready", s)
		}
	}
	if Ready(&corev1.Node{}) || ReadyCondition(&corev1.Node{}) != nil {
		t.Error("a node with no Ready condition (its kubelet never reported) is Ready")
	}
}

func TestDrainShown(t *testing.T) {
	cordoned := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}}
	signalled := withReady(corev1.ConditionTrue)
	signalled.Status.Conditions = append(signalled.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))})
	own := signalled.DeepCopy()
	own.Annotations = map[string]string{DrainConditionAnnotation: "2026-12-01T00:00:00Z"}
	for name, tt := range map[string]struct {
		node *corev1.Node
		want bool
	}{
		"cordoned":                         {cordoned, true},
		"another writer's DrainInProgress": {signalled, true},
		"nodeguard's own DrainInProgress":  {own, false},
		"schedulable":                      {withReady(corev1.ConditionTrue), false},
	} {
		if got := DrainShown(tt.node); got != tt.want {
			t.Errorf("%s: DrainShown = %v, want %v", name, got, tt.want)
		}
	}
}

func TestChargedElsewhere(t *testing.T) {
	now := metav1.Now()
	for name, tt := range map[string]struct {
		node *corev1.Node
		want string
	}{
		"deleting":          {&corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, "being deleted"},
		"scale-down":        {&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{ScaleDownClaimedAnnotation: "x"}}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ClusterAutoscalerTaintKey}}}}, "its scale-down by cluster-autoscaler was charged"},
		"NodeClaim":         {&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{NodeClaimDeleteChargedAtAnnotation: "x"}}}, "its NodeClaim's deletion was charged"},
		"nodeguard drains":  {&corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: DrainingTaintKey, Value: DrainingTaintValue}}}}, "drained by nodeguard"},
		"cordoned, nothing": {&corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}}, ""},
	} {
		if got := ChargedElsewhere(tt.node); got != tt.want {
			t.Errorf("%s: ChargedElsewhere = %q, want %q", name, got, tt.want)
		}
	}
}

func TestMarkDrainCharged(t *testing.T) {
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		DrainAskedAtAnnotation: "old", DrainConfirmedAtAnnotation: "old"}}}
	MarkDrainCharged(node, at, "kubernetes-admin", "ns/web-0")
	if by, charged := DrainCharged(node); !charged || by != "kubernetes-admin" || !DrainUnconfirmed(node) {
		t.Errorf("marks %v: want charged by kubernetes-admin and unconfirmed", node.Annotations)
	}
	found := &corev1.Node{}
	MarkDrainCharged(found, at, "an unknown drainer", "")
	if _, charged := DrainCharged(found); !charged || DrainUnconfirmed(found) {
		t.Errorf("marks %v: a drain found under way is charged and counts as confirmed", found.Annotations)
	}
}
