package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/upgrade"
)

type agentPools map[string]upgrade.Settings

func (p agentPools) AgentPools() (map[string]upgrade.Settings, error) { return p, nil }

// A budget written over an agent pool whose upgrade would wait on it past
// the pool's drain timeout is stored, with a warning kubectl prints naming
// the settings that fit; one that fits, or one of no agent pool, gets none.
func TestBudgetWriteWarnsOfAnUpgradeThatWouldNotFit(t *testing.T) {
	var objs []runtime.Object
	for i := range 6 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("user-%d", i),
			Labels: map[string]string{ngv1alpha1.AgentPoolLabel: "user"}}})
	}
	v := &BudgetValidator{
		Nodes:           fake.NewClientBuilder().WithScheme(fuzzScheme).WithRuntimeObjects(objs...).Build(),
		Upgrades:        agentPools{"user": {Pool: "user", MaxSurge: "3", DrainTimeout: time.Minute}},
		UpgradeNodeTime: 40 * time.Second,
	}
	review := func(maxUnavailable int, selector map[string]string) admission.Response {
		ndb := ngv1alpha1.NodeDisruptionBudget{
			TypeMeta:   metav1.TypeMeta{APIVersion: ngv1alpha1.GroupVersion.String(), Kind: "NodeDisruptionBudget"},
			ObjectMeta: metav1.ObjectMeta{Name: "user"},
			Spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: selector},
				MaxUnavailable: &intstr.IntOrString{IntVal: int32(maxUnavailable)}},
		}
		raw, err := json.Marshal(ndb)
		if err != nil {
			t.Fatal(err)
		}
		return v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
	}
	pool := map[string]string{ngv1alpha1.AgentPoolLabel: "user"}

	resp := review(1, pool)
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "maxSurge 1 with maxUnavailable 0") {
		t.Errorf("a budget of 1 under a surge of 3 and a 1m drain timeout: allowed %v, warnings %q; want stored with a warning naming the settings that fit", resp.Allowed, resp.Warnings)
	}
	if resp := review(3, pool); !resp.Allowed || len(resp.Warnings) != 0 {
		t.Errorf("a budget of 3 under a surge of 3: allowed %v, warnings %q; want none", resp.Allowed, resp.Warnings)
	}
	if resp := review(1, map[string]string{"pool": "other"}); !resp.Allowed || len(resp.Warnings) != 0 {
		t.Errorf("a budget of no agent pool's nodes: allowed %v, warnings %q; want none", resp.Allowed, resp.Warnings)
	}
}
