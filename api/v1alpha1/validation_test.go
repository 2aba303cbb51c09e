package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) { harness.Main(m, harness.Options{}, &env) }

func intOrString(v string) *intstr.IntOrString { return ptr.To(intstr.Parse(v)) }

func selectorOf(reqs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: reqs}
}

// TestValidation runs the CRD's schema and CEL rules in a real kube-apiserver:
// valid budgets are stored, and each invalid one is rejected with a message that
// tells the user what to fix.
func TestValidation(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	everyNode := &metav1.LabelSelector{}
	tests := []struct {
		name    string
		spec    ngv1alpha1.NodeDisruptionBudgetSpec
		wantErr string // empty: accepted
	}{
		{name: "maxUnavailable integer", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1")}},
		{name: "maxUnavailable zero", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("0")}},
		{name: "minAvailable percentage", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MinAvailable: intOrString("75%")}},
		{name: "percentage 100%", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("100%")}},
		{name: "percentage 0%", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MinAvailable: intOrString("0%")}},
		{name: "label selector", spec: ngv1alpha1.NodeDisruptionBudgetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.azure.com/agentpool": "user"}},
			MaxUnavailable: intOrString("2"),
		}},
		{name: "window", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("3"),
			Windows: []ngv1alpha1.DisruptionWindow{
				{Schedule: "0 8 * * 1-5", Duration: metav1.Duration{Duration: 10 * 3600e9}},
				{Schedule: "@daily", Duration: metav1.Duration{Duration: 90 * 60e9}, MaxUnavailable: intOrString("1")},
			}}},
		{name: "every selector operator", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1"),
			Selector: selectorOf(
				metav1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
				metav1.LabelSelectorRequirement{Key: "zone", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"1"}},
				metav1.LabelSelectorRequirement{Key: "spot", Operator: metav1.LabelSelectorOpDoesNotExist},
				metav1.LabelSelectorRequirement{Key: "kubernetes.io/os", Operator: metav1.LabelSelectorOpExists})}},
		{name: "unknown selector operator", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1"),
			Selector: selectorOf(
				metav1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}},
				metav1.LabelSelectorRequirement{Key: "zone", Operator: "Equals", Values: []string{"1"}})},
			wantErr: "spec.selector.matchExpressions: Invalid value: every operator must be In, NotIn, Exists or DoesNotExist"},
		{name: "In without values", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1"),
			Selector: selectorOf(metav1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpIn})},
			wantErr: "spec.selector.matchExpressions: Invalid value: values must be specified when operator is In or NotIn"},
		{name: "NotIn with empty values", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1"),
			Selector: selectorOf(metav1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpNotIn, Values: []string{}})},
			wantErr: "spec.selector.matchExpressions: Invalid value: values must be specified when operator is In or NotIn"},
		{name: "Exists with values", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1"),
			Selector: selectorOf(
				metav1.LabelSelectorRequirement{Key: "pool", Operator: metav1.LabelSelectorOpExists},
				metav1.LabelSelectorRequirement{Key: "spot", Operator: metav1.LabelSelectorOpDoesNotExist, Values: []string{"true"}})},
			wantErr: "spec.selector.matchExpressions: Invalid value: values may not be specified when operator is Exists or DoesNotExist"},
		{name: "neither minAvailable nor maxUnavailable", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode},
			wantErr: "exactly one of minAvailable or maxUnavailable must be set"},
		{name: "both minAvailable and maxUnavailable", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MinAvailable: intOrString("1"), MaxUnavailable: intOrString("1")},
			wantErr: "exactly one of minAvailable or maxUnavailable must be set"},
		{name: "negative maxUnavailable", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: ptr.To(intstr.FromInt32(-1))},
			wantErr: "spec.maxUnavailable: Invalid value: -1: must be a non-negative integer or a percentage from 0% to 100%"},
		{name: "percentage over 100%", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MinAvailable: intOrString("101%")},
			wantErr: "spec.minAvailable: Invalid value: \"101%\": must be a non-negative integer or a percentage from 0% to 100%"},
		{name: "word instead of a number", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: ptr.To(intstr.FromString("one"))},
			wantErr: "must be a non-negative integer or a percentage from 0% to 100%"},
		{name: "drain timeout", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1"),
			DrainTimeout: &metav1.Duration{Duration: 5400e9}}}, // 1h30m0s
		{name: "negative drain timeout", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1"),
			DrainTimeout: &metav1.Duration{Duration: -30e9}},
			wantErr: "spec.drainTimeout: Invalid value: \"-30s\": must be a duration in hours, minutes and seconds"},
		{name: "missing selector", spec: ngv1alpha1.NodeDisruptionBudgetSpec{MaxUnavailable: intOrString("1")},
			wantErr: "spec.selector: Required value"},
		{name: "bad cron schedule", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1"),
			Windows: []ngv1alpha1.DisruptionWindow{{Schedule: "0 8 * *", Duration: metav1.Duration{Duration: 3600e9}}}},
			wantErr: "spec.windows[0].schedule: Invalid value: \"0 8 * *\": must be a five-field cron expression"},
		{name: "window duration in seconds", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1"),
			Windows: []ngv1alpha1.DisruptionWindow{{Schedule: "@daily", Duration: metav1.Duration{Duration: 90e9}}}},
			wantErr: "spec.windows[0].duration: Invalid value: \"1m30s\": must be a duration in hours and minutes"},
		{name: "window maxUnavailable over 100%", spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: everyNode, MaxUnavailable: intOrString("1"),
			Windows: []ngv1alpha1.DisruptionWindow{{Schedule: "@daily", Duration: metav1.Duration{Duration: 3600e9}, MaxUnavailable: intOrString("150%")}}},
			wantErr: "spec.windows[0].maxUnavailable: Invalid value"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ndb := &ngv1alpha1.NodeDisruptionBudget{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("validation-%d", i)},
				Spec:       tt.spec,
			}
			err := env.Client.Create(context.Background(), ndb)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("valid budget rejected: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("invalid budget accepted, want error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}
