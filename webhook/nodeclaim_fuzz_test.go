package webhook

import (
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/labels"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// FuzzNodeClaimReview posts NodeClaim DELETE reviews as FuzzDeleteReview
// posts Node ones (see fuzz_test.go). The full budget selects every node and
// allows no disruption, so a NodeClaim delete may be allowed only when
// nothing is left to protect: the NodeClaim is deleting or has no node, or
// its node does not exist (the cluster holds ready-0 and held-0) or is
// deleting; and the budget's status never changes.
func FuzzNodeClaimReview(f *testing.F) {
	claimDelete := func(uid, claim string) string {
		return review("v1", `{"uid":"`+uid+`","kind":{"group":"karpenter.sh","version":"v1","kind":"NodeClaim"},"operation":"DELETE","name":"c","oldObject":`+claim+`}`)
	}
	nodeClaim := func(meta, status string) string {
		return `{"apiVersion":"karpenter.sh/v1","kind":"NodeClaim","metadata":{"name":"c"` + meta + `},"spec":{},"status":{` + status + `}}`
	}
	for _, s := range append(slices.Clone(reviewSeeds),
		claimDelete("k1", nodeClaim("", `"nodeName":"ready-0","providerID":"azure:///x"`)),
		claimDelete("k2", nodeClaim("", `"nodeName":"held-0"`)),
		claimDelete("k3", nodeClaim("", `"nodeName":"gone-0"`)),
		claimDelete("k4", nodeClaim("", ``)),
		claimDelete("k5", nodeClaim(`,"deletionTimestamp":"2026-01-01T00:00:00Z"`, `"nodeName":"ready-0"`)),
		claimDelete("k6", `{"apiVersion":"karpenter.sh/v1","kind":"NodeClaim","metadata":{"name":"c"},"status":null}`),
		review("v1", `{"uid":"k7","operation":"CREATE","object":`+nodeClaim("", `"nodeName":"ready-0"`)+`}`),
	) {
		f.Add([]byte(s), uint8(0))
	}
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := fake.NewClientBuilder().WithScheme(fuzzScheme).
		WithStatusSubresource(&ngv1alpha1.NodeDisruptionBudget{}).
		WithObjects(fullBudget(now), readyNode("ready-0"), readyNode("held-0"), adminHold("held-0", now)).
		Build()
	clk := clocktesting.NewFakePassiveClock(now)
	h := fuzzHandler(&NodeClaimDeleteHandler{
		Nodes:   c,
		Rule:    budget.NewRules(&budget.Claimer{Client: c, Reader: c, Clock: clk}, c, nil, clk).Deletion,
		Managed: labels.Everything(), Clock: clocktesting.NewFakePassiveClock(now), Timeout: time.Second,
	})
	f.Fuzz(func(t *testing.T, body []byte, pad uint8) {
		resp := postReview(t, h, reviewBody(body, pad))
		if resp.Allowed {
			requireNothingToProtect(t, body)
		}
		requireFullBudgetUncharged(t, c, now)
	})
}

// requireNothingToProtect fails unless the allowed NodeClaim DELETE has no
// node the full budget protects.
func requireNothingToProtect(t *testing.T, body []byte) {
	t.Helper()
	var sent admissionv1.AdmissionReview
	_ = utiljson.Unmarshal(body, &sent) // postReview checked it decodes
	if sent.Request.Operation != admissionv1.Delete {
		t.Fatalf("the NodeClaim webhook allowed a %q", sent.Request.Operation)
	}
	var claim nodeClaim
	if err := utiljson.Unmarshal(sent.Request.OldObject.Raw, &claim); err != nil {
		t.Fatalf("allowed a DELETE whose oldObject is no NodeClaim: %v", err)
	}
	if claim.Metadata.DeletionTimestamp == nil && (claim.Status.NodeName == "ready-0" || claim.Status.NodeName == "held-0") {
		t.Fatalf("allowed deleting the NodeClaim of node %q, which the full budget protects", claim.Status.NodeName)
	}
}
