package v1alpha1

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
