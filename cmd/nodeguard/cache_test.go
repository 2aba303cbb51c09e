package main

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCachedNodesKeepWhatNodeguardReads: the node cache's transform drops the
// managed fields, the kubelet's inventory and its pressure conditions, and
// keeps the metadata, the spec, the Ready condition, the drain's (KEP-5683's
// and nodeguard's own), and the addresses: a draining node's pass reads it.
func TestCachedNodesKeepWhatNodeguardReads(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "a"}, Finalizers: []string{"f"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.NodeSpec{ProviderID: "azure:///x", Unschedulable: true,
			Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
				{Type: "nodeguard.io/TrafficCut", Status: corev1.ConditionTrue},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionTrue},
				{Type: corev1.NodeDrained, Status: corev1.ConditionFalse},
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
			Capacity:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
			NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"},
			Images:    []corev1.ContainerImage{{Names: []string{"pause"}}},
		},
	}
	want := node.DeepCopy()
	want.ManagedFields = nil
	c := want.Status.Conditions
	want.Status = corev1.NodeStatus{Conditions: []corev1.NodeCondition{c[1], c[2], c[4], c[5]}, Addresses: want.Status.Addresses}

	got, err := trimNode(node)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("trimmed node\n%+v\nwant\n%+v", got, want)
	}
}
