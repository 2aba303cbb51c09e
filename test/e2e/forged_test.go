package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// postEvictionReview posts a pods/eviction CREATE AdmissionReview for the pod
// straight to nodeguard's webhook server, as any pod that reaches its port
// could where no NetworkPolicy engine runs, in the name of user.
func postEvictionReview(t *testing.T, ns, pod, user string) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"apiVersion": "policy/v1", "kind": "Eviction",
		"metadata": map[string]string{"namespace": ns, "name": pod}})
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("forged-" + pod), Namespace: ns, Name: pod, Operation: admissionv1.Create, SubResource: "eviction",
			Kind:     metav1.GroupVersionKind{Group: "policy", Version: "v1", Kind: "Eviction"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			UserInfo: authenticationv1.UserInfo{Username: user},
			Object:   runtime.RawExtension{Raw: raw},
		},
	}
	return harness.PostReview(t, env.WebhookAddr(), ngwebhook.EvictionPath, &review)
}

// TestForgedEvictionReviewLeavesNothingBehind: a pod inside the cluster posts
// an eviction review for a pod of a cordoned node straight to the webhook port
// (no API server, so no eviction follows). nodeguard charges the drain, marks
// the node and cuts its traffic as for a real first eviction, and withdraws
// all of it --unconfirmed-claim-timeout later: no charge, no mark, entries
// None, a DrainChargeWithdrawn Warning. The pod stays where it was.
func TestForgedEvictionReviewLeavesNothingBehind(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	top := newTopology(t, "forgedev", false)
	harness.MustCreate(t, env.Client, builder.NDB(top.ns, builder.NDBSelecting("pool", top.ns), builder.NDBMaxUnavailable("1")))
	startNodeguard(t, env.Kubeconfig, top.emulator)
	waitForBudgetAllowed(t, top.ns, 1)
	harness.MustKubectl(t, env.Kubeconfig, "", "cordon", top.target)
	t.Cleanup(func() { _, _ = harness.Kubectl(env.Kubeconfig, "", "uncordon", top.target) })
	pods := podNamesOn(t, top.ns, top.target)
	if len(pods) == 0 {
		t.Fatalf("no pod on %s", top.target)
	}
	pod := slices.Sorted(func(yield func(string) bool) {
		for p := range pods {
			if !yield(p) {
				return
			}
		}
	})[0]

	// The webhook's pod cache may not show the pod at once: post until the
	// review is charged (with Azure its answer is 429 "traffic cut").
	var posted time.Time
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		resp := postEvictionReview(t, top.ns, pod, "system:serviceaccount:tenant:forger")
		posted = time.Now()
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &node); err != nil {
			return false, err
		}
		_, charged := ngv1alpha1.DrainCharged(&node)
		return charged || (resp.Result != nil && strings.Contains(resp.Result.Message, "traffic")), nil
	}, "the forged review charges the drain of %s", top.target)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		states := top.targetStates()
		return len(states) > 0 && slices.ContainsFunc(states, func(s string) bool { return strings.HasSuffix(s, "=Down") }), nil
	}, "the forged review cut the traffic of %s (as a real first eviction does)", top.target)

	harness.Eventually(t, budget.DefaultUnconfirmedClaimTimeout+30*time.Second, func(ctx context.Context) (bool, error) {
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &node); err != nil {
			return false, err
		}
		var ndb ngv1alpha1.NodeDisruptionBudget
		if err := env.Client.Get(ctx, client.ObjectKey{Name: top.ns}, &ndb); err != nil {
			return false, err
		}
		_, marked := ngv1alpha1.DrainCharged(&node)
		states := top.targetStates()
		none := len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=None") })
		return !marked && len(ndb.Status.DisruptedNodes) == 0 && ndb.Status.DisruptionsAllowed == 1 && none, nil
	}, "the forged review's charge, mark and cut of %s are undone", top.target)
	took := time.Since(posted)
	t.Logf("undone %s after the forged review", took.Round(100*time.Millisecond))
	if took < budget.DefaultUnconfirmedClaimTimeout-time.Second {
		t.Errorf("undone after %s, before --unconfirmed-claim-timeout (%s): a real drain's retries would not have kept it", took, budget.DefaultUnconfirmedClaimTimeout)
	}
	harness.WaitForEvent(t, env.Client, top.target, finalizer.ReasonDrainWithdrawn)
	if !podNamesOn(t, top.ns, top.target)[pod] {
		t.Errorf("pod %s left %s: nothing evicted it", pod, top.target)
	}
}
