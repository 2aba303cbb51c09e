package webhook_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// testUnconfirmedTimeout is the guards' --unconfirmed-claim-timeout here.
const testUnconfirmedTimeout = 3 * time.Second

// postDeleteReview posts a Node DELETE AdmissionReview for the node as it is
// now straight to the guard's webhook server, as any pod that reaches the
// port could, and returns the answer.
func postDeleteReview(t *testing.T, g *guard, name string, dryRun bool) *admissionv1.AdmissionResponse {
	t.Helper()
	node := getNode(t, name)
	node.APIVersion, node.Kind = "v1", "Node"
	raw, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("forged-" + name), Name: name, Operation: admissionv1.Delete, DryRun: ptr.To(dryRun),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Node"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "nodes"},
			OldObject: runtime.RawExtension{Raw: raw},
		},
	}
	return harness.PostReview(t, g.addr, ngwebhook.DeletePath, &review)
}

// TestForgedDeleteReviewClaimIsGivenBackUnconfirmed: a DELETE review posted
// straight to the webhook server (no API server, so no node deletion follows)
// charges the budget, and the status controller gives the claim back once the
// node shows no deletion within the unconfirmed-claim timeout, with a Warning
// event and a count; the claim of a real delete admitted just before is kept.
// A dry-run review charges nothing.
func TestForgedDeleteReviewClaimIsGivenBackUnconfirmed(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	recorder := newRecorder(t)
	mgr, addr, answers := newManager(t)
	setupGuard(t, mgr, true, false, func(r *budget.StatusReconciler) {
		r.UnconfirmedTimeout, r.Recorder = testUnconfirmedTimeout, recorder
	})
	g := run(t, mgr, addr, answers)
	useGuards(t, g)
	pool := uniqueName("forged")
	nodes := createReadyNodes(t, pool, 3)
	releaseOnCleanup(t, nodes...)
	createBudget(t, pool, 2, builder.NDBMaxUnavailable("2"))
	givenBackBefore := harness.CounterSum(t, "nodeguard_ndb_unconfirmed_claims_total", "ndb", pool)

	if resp := postDeleteReview(t, g, nodes[2], true); !resp.Allowed {
		t.Fatalf("dry-run review denied: %+v", resp.Result)
	}
	if ndb := getBudget(t, pool); len(ndb.Status.DisruptedNodes) != 0 {
		t.Fatalf("a dry-run review charged the budget: %v", ndb.Status.DisruptedNodes)
	}

	// A real delete first, then the forged review: the status pass that gives
	// the forged claim back has the real one past its deadline too.
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", nodes[0], "--wait=false"); err != nil {
		t.Fatalf("kubectl delete node %s: %v\n%s", nodes[0], err, out)
	}
	posted := time.Now()
	if resp := postDeleteReview(t, g, nodes[1], false); !resp.Allowed {
		t.Fatalf("forged review denied: %+v", resp.Result)
	}
	if ndb := getBudget(t, pool); ndb.Status.DisruptionsAllowed != 0 {
		t.Fatalf("after the forged review the budget allows %d, want 0 (charged)", ndb.Status.DisruptionsAllowed)
	}

	harness.Eventually(t, testUnconfirmedTimeout+10*time.Second, func(ctx context.Context) (bool, error) {
		ndb := getBudget(t, pool)
		_, forged := ndb.Status.DisruptedNodes[nodes[1]]
		return !forged && ndb.Status.DisruptionsAllowed == 1, nil
	}, "the forged claim of %s is given back", nodes[1])
	took := time.Since(posted)
	t.Logf("forged claim given back %s after the review", took.Round(10*time.Millisecond))
	if took < testUnconfirmedTimeout-time.Second { // claim times are kept to the second
		t.Errorf("given back after %s, before the unconfirmed-claim timeout %s", took, testUnconfirmedTimeout)
	}
	ndb := getBudget(t, pool)
	if _, kept := ndb.Status.DisruptedNodes[nodes[0]]; !kept || ndb.Status.DisruptionsAllowed != 1 {
		t.Errorf("the real delete's claim of %s: disruptedNodes %v, allowed %d; want it kept, allowing 1",
			nodes[0], ndb.Status.DisruptedNodes, ndb.Status.DisruptionsAllowed)
	}
	wantDeleting(t, nodes[0])
	wantNotDeleting(t, nodes[1])
	waitForEvent(t, "NodeDisruptionBudget", pool, budget.ReasonClaimUnconfirmed, "claim of node "+nodes[1])
	if got := harness.CounterSum(t, "nodeguard_ndb_unconfirmed_claims_total", "ndb", pool) - givenBackBefore; got != 1 {
		t.Errorf("nodeguard_ndb_unconfirmed_claims_total{ndb=%q} rose by %v, want 1", pool, got)
	}
}
