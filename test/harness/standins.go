package harness

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreateRunningPod creates pod and writes its status Running and Ready, as
// the kubelet would report it, for tests without kubelets.
func CreateRunningPod(t testing.TB, c client.Client, pod *corev1.Pod) {
	t.Helper()
	MustCreate(t, c, pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

// CreatePDBWithStatus creates pdb and writes status, computed for its
// generation, as the disruption controller would, for tests without
// kube-controller-manager.
func CreatePDBWithStatus(t testing.TB, c client.Client, pdb *policyv1.PodDisruptionBudget, status policyv1.PodDisruptionBudgetStatus) {
	t.Helper()
	MustCreate(t, c, pdb)
	status.ObservedGeneration = pdb.Generation
	pdb.Status = status
	if err := c.Status().Update(context.Background(), pdb); err != nil {
		t.Fatal(err)
	}
}
