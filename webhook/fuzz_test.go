package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// The fuzz targets post whole AdmissionReview bodies to the webhook handlers
// as the webhook server serves them (controller-runtime's HTTP decoding, the
// size limit, both AdmissionReview versions), with panics not recovered so
// that the fuzzer sees them. Every request must get an AdmissionReview answer
// (HTTP 200), an allowed answer must carry the request's UID, and:
//
//   - DELETE: the one budget selects every node and allows no disruption, so
//     nothing but a delete the budget lets go (a node already deleting, or one
//     it charged already) may be allowed, and the budget's status never changes;
//   - CREATE/UPDATE: a patch adds exactly the termination finalizer, and only
//     to a Node that lacks it and is not being deleted.
//
// `make fuzz` runs each target for $(FUZZTIME); plain go test runs the seeds.
// The fake client stands in for the API server: fuzzing needs thousands of
// requests a second, and the budget claim's conflicts and the real API server
// are covered by the envtest tests (TestConcurrentDeletesNeverOverAdmit).

// oversizedPad, as a fuzz input, pads the body past the 7 MiB the webhook
// server reads. Only that one value of 256 does, so the fuzzer spends little
// time on bodies that large.
const oversizedPad = 0xff

// maxReviewBytes is controller-runtime's admission body limit.
const maxReviewBytes = 7 << 20

func reviewBody(body []byte, pad uint8) []byte {
	if pad != oversizedPad {
		return body
	}
	// Leading whitespace keeps valid JSON valid: only the size is wrong.
	return append(bytes.Repeat([]byte(" "), maxReviewBytes), body...)
}

func review(version, request string) string {
	return `{"apiVersion":"admission.k8s.io/` + version + `","kind":"AdmissionReview","request":` + request + `}`
}

// reviewSeeds are bodies both targets start from.
var reviewSeeds = []string{
	``, `null`, `{}`, `[]`, `{"apiVersion":`, `"review"`,
	review("v1", `null`),
	review("v1", `{}`),
	review("v2", `{"uid":"u1","operation":"DELETE","oldObject":{"apiVersion":"v1","kind":"Node","metadata":{"name":"ready-0"}}}`),
	`{"apiVersion":"v1","kind":"Node","metadata":{"name":"not-a-review"}}`,
	review("v1", `{"uid":"u2","operation":"CONNECT","object":{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}}`),
	review("v1", `{"uid":"u3","operation":"DELETE","oldObject":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}}`),
	review("v1", `{"uid":"u4","operation":"CREATE","object":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}}`),
}

// nodeJSON is a node object for seeds.
func nodeJSON(name, extraMeta, spec, status string) string {
	return `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"` + extraMeta + `},"spec":{` + spec + `},"status":{` + status + `}}`
}

const (
	readyStatus   = `"conditions":[{"type":"Ready","status":"True"}]`
	withFinalizer = `,"finalizers":["` + ngv1alpha1.TerminationFinalizer + `"]`
)

// fuzzHandler serves h as the webhook server does, without recovering panics.
func fuzzHandler(h admission.Handler) http.Handler {
	return (&admission.Webhook{Handler: h}).WithRecoverPanic(false)
}

// postReview posts body and returns the answer, failing unless it is an
// AdmissionReview with a response; allowed answers must echo the request UID
// (the request read as Kubernetes reads JSON: keys are case-sensitive).
func postReview(t *testing.T, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d, want 200 with an AdmissionReview", rec.Code)
	}
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil || answer.Response == nil {
		t.Fatalf("answer is no AdmissionReview with a response (%v): %.300s", err, rec.Body.String())
	}
	// 5 operation labels (4 and "other") times at most 4 results and 8 reasons.
	if n := testutil.CollectAndCount(decisions); n > 5*4*8 {
		t.Fatalf("%d admission decision series: a label takes values from the request", n)
	}
	if answer.Response.Allowed {
		var sent admissionv1.AdmissionReview
		if err := utiljson.Unmarshal(body, &sent); err != nil || sent.Request == nil || sent.Request.UID != answer.Response.UID {
			t.Fatalf("allowed answer with UID %q to a body that is no review with that request UID: %.300s", answer.Response.UID, body)
		}
	}
	return answer.Response
}

// fullBudget selects every node, wants 3 of 4 available, has 2 (one node
// charged, one down) and lets unavailable nodes go only while healthy: it
// allows no deletion of any node but the one it charged.
func fullBudget(now time.Time) *ngv1alpha1.NodeDisruptionBudget {
	return &ngv1alpha1.NodeDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "full", Generation: 1},
		Spec: ngv1alpha1.NodeDisruptionBudgetSpec{
			Selector:                    &metav1.LabelSelector{},
			MaxUnavailable:              ptr.To(intstr.FromInt32(1)),
			UnhealthyNodeDeletionPolicy: ngv1alpha1.IfHealthyBudget,
		},
		Status: ngv1alpha1.NodeDisruptionBudgetStatus{
			ObservedGeneration: 1, ExpectedNodes: 4, CurrentAvailable: 2, DesiredAvailable: 3, DisruptionsAllowed: 0,
			DisruptedNodes: map[string]metav1.Time{"charged-0": metav1.NewTime(now.Add(-time.Minute))},
		},
	}
}

func FuzzDeleteReview(f *testing.F) {
	deleteOf := func(uid, node string, dryRun bool) string {
		return review("v1", `{"uid":"`+uid+`","kind":{"group":"","version":"v1","kind":"Node"},"operation":"DELETE","name":"x","dryRun":`+
			map[bool]string{true: "true", false: "false"}[dryRun]+`,"oldObject":`+node+`}`)
	}
	for _, s := range append(slices.Clone(reviewSeeds),
		deleteOf("d1", nodeJSON("ready-0", withFinalizer, "", readyStatus), false),
		deleteOf("d2", nodeJSON("ready-0", withFinalizer, "", readyStatus), true),
		deleteOf("d3", nodeJSON("ready-0", "", "", readyStatus), false),
		deleteOf("d4", nodeJSON("charged-0", withFinalizer, "", readyStatus), false),
		deleteOf("d5", nodeJSON("gone-0", withFinalizer+`,"deletionTimestamp":"2026-01-01T00:00:00Z"`, "", readyStatus), false),
		deleteOf("d6", nodeJSON("held-0", withFinalizer, "", readyStatus), false),
		deleteOf("d7", nodeJSON("ready-0", withFinalizer, `"taints":[{"key":"node.kubernetes.io/out-of-service","effect":"NoExecute"}]`, ""), false),
		deleteOf("d8", nodeJSON("ready-0", withFinalizer+`,"annotations":{"`+ngv1alpha1.FinalizerAddedAtAnnotation+`":"2020-01-01T00:00:00Z"}`, "", readyStatus), false),
		strings.Replace(deleteOf("d9", nodeJSON("ready-0", withFinalizer, "", readyStatus), false), `"v1","kind":"AdmissionReview"`, `"v1beta1","kind":"AdmissionReview"`, 1),
	) {
		f.Add([]byte(s), uint8(0))
	}
	f.Add([]byte(deleteOf("big", nodeJSON("ready-0", withFinalizer, "", readyStatus), false)), uint8(oversizedPad))
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	// One cluster for every input (building it costs more than a request):
	// no input may change the budget, which each one checks, and a node patch
	// (the missing-finalizer step) does not change what later inputs decide.
	c := fake.NewClientBuilder().WithScheme(fuzzScheme).
		WithStatusSubresource(&ngv1alpha1.NodeDisruptionBudget{}).
		WithObjects(fullBudget(now), readyNode("ready-0"), adminHold("held-0", now)).
		Build()
	clk := clocktesting.NewFakePassiveClock(now)
	h := fuzzHandler(&DeleteHandler{
		Client: c, Reader: c,
		Rule:    budget.NewRules(&budget.Claimer{Client: c, Reader: c, Clock: clk}, c, nil, clk).Deletion,
		Managed: labels.Everything(), Clock: clocktesting.NewFakePassiveClock(now), Timeout: time.Second,
	})
	f.Fuzz(func(t *testing.T, body []byte, pad uint8) {
		resp := postReview(t, h, reviewBody(body, pad))
		if resp.Allowed {
			requireBudgetLetsGo(t, body)
		}
		requireFullBudgetUncharged(t, c, now)
	})
}

// requireFullBudgetUncharged fails when a request changed fullBudget's
// numbers or charged it a node.
func requireFullBudgetUncharged(t *testing.T, c client.Client, now time.Time) {
	t.Helper()
	var after ngv1alpha1.NodeDisruptionBudget
	if err := c.Get(context.Background(), client.ObjectKey{Name: "full"}, &after); err != nil {
		t.Fatal(err)
	}
	if want := fullBudget(now).Status; after.Status.CurrentAvailable != want.CurrentAvailable ||
		after.Status.DisruptionsAllowed != want.DisruptionsAllowed || len(after.Status.DisruptedNodes) != len(want.DisruptedNodes) {
		t.Fatalf("a request charged the full budget: status %+v", after.Status)
	}
}

// requireBudgetLetsGo fails unless the allowed DELETE is one fullBudget lets
// go: its node is already deleting, or it is the node the budget charged.
func requireBudgetLetsGo(t *testing.T, body []byte) {
	t.Helper()
	var sent admissionv1.AdmissionReview
	_ = utiljson.Unmarshal(body, &sent) // postReview checked it decodes
	node, err := decodeNode(sent.Request.OldObject, "oldObject")
	if err != nil {
		t.Fatalf("allowed a DELETE whose oldObject is no node: %v", err)
	}
	if sent.Request.Operation != admissionv1.Delete {
		t.Fatalf("the DELETE webhook allowed a %q", sent.Request.Operation)
	}
	if node.DeletionTimestamp == nil && node.Name != "charged-0" {
		t.Fatalf("allowed deleting node %q, which the full budget denies", node.Name)
	}
}

func FuzzFinalizerReview(f *testing.F) {
	write := func(op, uid, node string) string {
		return review("v1", `{"uid":"`+uid+`","operation":"`+op+`","object":`+node+`}`)
	}
	for _, s := range append(slices.Clone(reviewSeeds),
		write("CREATE", "c1", nodeJSON("n", "", "", "")),
		write("CREATE", "c2", nodeJSON("n", `,"finalizers":["example.com/keep"]`, "", "")),
		write("UPDATE", "c3", nodeJSON("n", withFinalizer, "", readyStatus)),
		write("UPDATE", "c4", nodeJSON("n", `,"deletionTimestamp":"2026-01-01T00:00:00Z"`, "", "")),
		write("CREATE", "c5", nodeJSON("n", `,"labels":{"managed":"no"}`, "", "")),
		write("DELETE", "c6", nodeJSON("n", "", "", "")),
		write("CREATE", "c7", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","finalizers":null}}`),
		strings.Replace(write("CREATE", "c8", nodeJSON("n", "", "", "")), `"v1","kind":"AdmissionReview"`, `"v1beta1","kind":"AdmissionReview"`, 1),
	) {
		f.Add([]byte(s), uint8(0))
	}
	f.Add([]byte(write("CREATE", "big", nodeJSON("n", "", "", ""))), uint8(oversizedPad))
	managed, err := labels.Parse("managed!=no")
	if err != nil {
		f.Fatal(err)
	}
	h := fuzzHandler(&FinalizerHandler{Managed: managed})
	f.Fuzz(func(t *testing.T, body []byte, pad uint8) {
		resp := postReview(t, h, reviewBody(body, pad))
		if len(resp.Patch) == 0 {
			return
		}
		requireFinalizerPatch(t, body, resp, managed)
	})
}

// requireMarkPatch fails unless op adds the finalizer-added-at mark, with a
// time, and nothing else: the whole map only where there was none.
func requireMarkPatch(t *testing.T, patch []byte, op jsonpatch.Operation, annotations map[string]string) {
	t.Helper()
	var value any = op.Value
	switch op.Path {
	case "/metadata/annotations":
		m, ok := op.Value.(map[string]any)
		if !ok || len(m) != 1 || len(annotations) > 0 {
			t.Fatalf("patch %s writes annotations %v over %v", patch, op.Value, annotations)
		}
		value = m[ngv1alpha1.FinalizerAddedAtAnnotation]
	case "/metadata/annotations/nodeguard.io~1finalizer-added-at":
		if len(annotations) == 0 {
			t.Fatalf("patch %s adds to missing annotations", patch)
		}
	default:
		t.Fatalf("patch %s touches %s", patch, op.Path)
	}
	if s, ok := value.(string); op.Operation != "add" || !ok {
		t.Fatalf("patch %s: the mark is not an added string", patch)
	} else if _, err := ngv1alpha1.ParseTime(s); err != nil {
		t.Fatalf("patch %s: the mark %q is no time: %v", patch, s, err)
	}
}

// requireFinalizerPatch fails unless the patch adds exactly the termination
// finalizer to a managed CREATE/UPDATE node that lacks it and is not deleting.
func requireFinalizerPatch(t *testing.T, body []byte, resp *admissionv1.AdmissionResponse, managed labels.Selector) {
	t.Helper()
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("a patch on an answer that is not an allowed JSON patch: %+v", resp)
	}
	var sent admissionv1.AdmissionReview
	_ = utiljson.Unmarshal(body, &sent) // postReview checked it decodes
	if op := sent.Request.Operation; op != admissionv1.Create && op != admissionv1.Update {
		t.Fatalf("patched a %q", op)
	}
	node, err := decodeNode(sent.Request.Object, "object")
	if err != nil {
		t.Fatalf("patched an object that is no node: %v", err)
	}
	if node.DeletionTimestamp != nil || !managed.Matches(labels.Set(node.Labels)) || slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("patched node %q (deleting %v, labels %v, finalizers %v)", node.Name, node.DeletionTimestamp != nil, node.Labels, node.Finalizers)
	}
	var ops []jsonpatch.Operation
	adds := 1
	if sent.Request.Operation == admissionv1.Update {
		adds = 2 // and the finalizer-added-at mark
	}
	if err := json.Unmarshal(resp.Patch, &ops); err != nil || len(ops) != adds || ops[0].Operation != "add" {
		t.Fatalf("patch %s is not %d add(s) (%v)", resp.Patch, adds, err)
	}
	if adds == 2 {
		requireMarkPatch(t, resp.Patch, ops[1], node.Annotations)
	}
	got, _ := json.Marshal(ops[0].Value)
	var want []byte
	switch ops[0].Path {
	case "/metadata/finalizers":
		want, _ = json.Marshal([]string{ngv1alpha1.TerminationFinalizer})
		if len(node.Finalizers) > 0 {
			t.Fatalf("patch %s replaces the finalizers %v", resp.Patch, node.Finalizers)
		}
	case "/metadata/finalizers/-":
		want, _ = json.Marshal(ngv1alpha1.TerminationFinalizer)
		if len(node.Finalizers) == 0 {
			t.Fatalf("patch %s appends to a missing list", resp.Patch)
		}
	default:
		t.Fatalf("patch %s touches %s", resp.Patch, ops[0].Path)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("patch %s adds %s, want %s", resp.Patch, got, want)
	}
}

var fuzzScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(ngv1alpha1.AddToScheme(s))
	return s
}()

func readyNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{ngv1alpha1.TerminationFinalizer}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

// adminHold is an administrator's maintenance hold on a node.
func adminHold(node string, now time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kubeadm-admin"), LeaseDurationSeconds: ptr.To[int32](60),
			RenewTime: ptr.To(metav1.NewMicroTime(now))},
	}
}
