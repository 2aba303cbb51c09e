package drain

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

func deployment(replicas int32, surge, unavailable string) *appsv1.Deployment {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	d.Spec.Replicas = ptr.To(replicas)
	d.Spec.Strategy.Type = appsv1.RollingUpdateDeploymentStrategyType
	ru := &appsv1.RollingUpdateDeployment{}
	if surge != "" {
		ru.MaxSurge = ptr.To(intstr.Parse(surge))
	}
	if unavailable != "" {
		ru.MaxUnavailable = ptr.To(intstr.Parse(unavailable))
	}
	d.Spec.Strategy.RollingUpdate = ru
	return d
}

// TestFenceposts: the Deployment controller's rounding (surge up,
// unavailable down, both 0 makes unavailable 1), defaults 25%/25%.
func TestFenceposts(t *testing.T) {
	tests := []struct {
		replicas                   int32
		surge, unavailable         string
		wantSurge, wantUnavailable int32
	}{
		{1, "", "", 1, 0},
		{3, "25%", "25%", 1, 0},
		{4, "25%", "25%", 1, 1},
		{10, "25%", "25%", 3, 2},
		{1, "0", "1", 0, 1},
		{3, "0", "0%", 0, 1}, // both 0: the controller takes 1 down
		{3, "1", "0", 1, 0},
		{5, "50%", "10%", 3, 0},
	}
	for _, tt := range tests {
		s, u := Fenceposts(deployment(tt.replicas, tt.surge, tt.unavailable))
		if s != tt.wantSurge || u != tt.wantUnavailable {
			t.Errorf("%d replicas, maxSurge %q, maxUnavailable %q: surge %d unavailable %d, want %d and %d",
				tt.replicas, tt.surge, tt.unavailable, s, u, tt.wantSurge, tt.wantUnavailable)
		}
	}
}

// TestCanReplace is the rule: replicas - maxUnavailable >= desiredHealthy,
// with a rolling update that surges.
func TestCanReplace(t *testing.T) {
	recreate := deployment(1, "", "")
	recreate.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	paused := deployment(1, "", "")
	paused.Spec.Paused = true
	tests := []struct {
		name                   string
		d                      *appsv1.Deployment
		healthy, desired, also int32
		wantOK                 bool
		wantWhy                string
	}{
		{"one replica, minAvailable 1, defaults", deployment(1, "", ""), 1, 1, 0, true, ""},
		{"three replicas, minAvailable 3, defaults", deployment(3, "", ""), 3, 3, 0, true, ""},
		{"four replicas, minAvailable 4: 25% rounds down to 1", deployment(4, "", ""), 4, 4, 0, false, "may stop 1 pod(s)"},
		{"four replicas, maxUnavailable 0", deployment(4, "25%", "0"), 4, 4, 0, true, ""},
		{"maxSurge 0", deployment(2, "0", "1"), 2, 2, 0, false, "maxSurge 0"},
		{"recreate", recreate, 1, 1, 0, false, "Recreate"},
		{"paused", paused, 1, 1, 0, false, "paused"},
		{"another rollout under the PDB may take one down", deployment(3, "1", "0"), 3, 3, 1, false, "which would leave 2 healthy where the PDB requires 3"},
	}
	for _, tt := range tests {
		ok, why := CanReplace(tt.d, tt.healthy, tt.desired, tt.also)
		if ok != tt.wantOK || !strings.Contains(why, tt.wantWhy) {
			t.Errorf("%s: CanReplace = %v %q, want %v and a reason containing %q", tt.name, ok, why, tt.wantOK, tt.wantWhy)
		}
	}
}

// TestPolicyFor: the Deployment's annotation wins over the PDB's, which wins
// over the flag; an invalid value waits and says where it is.
func TestPolicyFor(t *testing.T) {
	annotated := func(v string) map[string]string {
		if v == "" {
			return nil
		}
		return map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: v}
	}
	tests := []struct {
		deployment, pdb string
		global          BlockedPDBPolicy
		want            BlockedPDBPolicy
		wantSource      string
		wantErr         bool
	}{
		{"", "", "", BlockedPDBReplace, "--blocked-pdb-policy", false},
		{"", "", BlockedPDBWait, BlockedPDBWait, "--blocked-pdb-policy", false},
		{"", "wait", BlockedPDBReplace, BlockedPDBWait, "annotation on PDB ns/web", false},
		{"replace", "wait", BlockedPDBWait, BlockedPDBReplace, "annotation on Deployment ns/web", false},
		{"wait", "", BlockedPDBReplace, BlockedPDBWait, "annotation on Deployment ns/web", false},
		{"", "always", BlockedPDBReplace, BlockedPDBWait, "annotation on PDB ns/web", true},
	}
	for _, tt := range tests {
		d := deployment(1, "", "")
		d.Annotations = annotated(tt.deployment)
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: annotated(tt.pdb)}}
		got, source, err := PolicyFor(d, pdb, tt.global)
		if got != tt.want || source != tt.wantSource || (err != nil) != tt.wantErr {
			t.Errorf("deployment %q, pdb %q, global %q: %q from %q (err %v), want %q from %q (err %v)",
				tt.deployment, tt.pdb, tt.global, got, source, err, tt.want, tt.wantSource, tt.wantErr)
		}
	}
}

// TestBlockedByDesign: a queue is blocked by design only when every pod the
// PDB expects is healthy and none is being disrupted.
func TestBlockedByDesign(t *testing.T) {
	status := func(allowed, healthy, desired, expected int32, disrupted bool) policyv1.PodDisruptionBudgetStatus {
		s := policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, DisruptionsAllowed: allowed, CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: expected}
		if disrupted {
			s.DisruptedPods = map[string]metav1.Time{"web-0": metav1.NewTime(now)}
		}
		return s
	}
	tests := []struct {
		name   string
		status policyv1.PodDisruptionBudgetStatus
		want   bool
	}{
		{"one replica under minAvailable 1", status(0, 1, 1, 1, false), true},
		{"three under maxUnavailable 0", status(0, 3, 3, 3, false), true},
		{"a pod elsewhere is not healthy", status(0, 2, 2, 3, false), false},
		{"an eviction is in progress", status(0, 1, 1, 1, true), false},
		{"allows one", status(1, 2, 1, 2, false), false},
		{"no pods expected", status(0, 0, 0, 0, false), false},
	}
	for _, tt := range tests {
		b := pdb("web", app("web"))
		b.Generation = 1
		b.Status = tt.status
		plan, err := NewPlan([]corev1.Pod{pod("web-1", "web", ready)}, []policyv1.PodDisruptionBudget{b}, last)
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.Groups[0].ByDesign; got != tt.want {
			t.Errorf("%s: ByDesign = %v, want %v", tt.name, got, tt.want)
		}
	}
}
