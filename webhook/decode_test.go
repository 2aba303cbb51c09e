package webhook

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

func FuzzDecodeNode(f *testing.F) {
	for _, seed := range []string{
		`{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}`,
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`,
		`{"kind":"Node","metadata":{"name":""}}`,
		`{"kind":"Node","metadata":{"name":"n","finalizers":[1,2]}}`,
		`null`, ``, `[]`, `{`, `"node"`, `{"kind":"Node","metadata":{"name":"n"},"spec":{"taints":"x"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		node, err := decodeNode(runtime.RawExtension{Raw: data}, "object")
		if err == nil && (node == nil || node.Name == "" || node.Kind != "Node") {
			t.Fatalf("decoded %q into an invalid node %+v without an error", data, node)
		}
	})
}

func request(op admissionv1.Operation, object, oldObject string) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op,
		Object:    runtime.RawExtension{Raw: []byte(object)},
		OldObject: runtime.RawExtension{Raw: []byte(oldObject)},
	}}
}

func TestFinalizerHandler(t *testing.T) {
	at := time.Date(2026, 11, 27, 16, 43, 10, 0, time.UTC)
	h := &FinalizerHandler{Managed: labels.SelectorFromSet(labels.Set{"managed": "yes"}), Clock: clocktesting.NewFakePassiveClock(at)}
	mark := ngv1alpha1.FormatTime(at)
	tests := []struct {
		name        string
		req         admission.Request
		wantAllowed bool
		wantCode    int32
		wantPatch   []jsonpatch.Operation
	}{
		{name: "managed node without finalizers gets the list",
			req:         request(admissionv1.Create, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","labels":{"managed":"yes"}}}`, ""),
			wantAllowed: true, wantPatch: []jsonpatch.Operation{{Operation: "add", Path: "/metadata/finalizers", Value: []string{ngv1alpha1.TerminationFinalizer}}}},
		{name: "managed node with other finalizers gets ours appended, and an update the mark",
			req:         request(admissionv1.Update, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","labels":{"managed":"yes"},"finalizers":["a"]}}`, ""),
			wantAllowed: true, wantPatch: []jsonpatch.Operation{{Operation: "add", Path: "/metadata/finalizers/-", Value: ngv1alpha1.TerminationFinalizer},
				{Operation: "add", Path: "/metadata/annotations", Value: map[string]string{ngv1alpha1.FinalizerAddedAtAnnotation: mark}}}},
		{name: "an update's mark joins the annotations there are",
			req:         request(admissionv1.Update, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","labels":{"managed":"yes"},"annotations":{"a":"b"}}}`, ""),
			wantAllowed: true, wantPatch: []jsonpatch.Operation{{Operation: "add", Path: "/metadata/finalizers", Value: []string{ngv1alpha1.TerminationFinalizer}},
				{Operation: "add", Path: "/metadata/annotations/nodeguard.io~1finalizer-added-at", Value: mark}}},
		{name: "node that has it is left alone",
			req:         request(admissionv1.Update, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","labels":{"managed":"yes"},"finalizers":["nodeguard.io/termination"]}}`, ""),
			wantAllowed: true},
		{name: "unmanaged node is left alone",
			req:         request(admissionv1.Create, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n"}}`, ""),
			wantAllowed: true},
		{name: "deleting node is left alone",
			req:         request(admissionv1.Update, `{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","labels":{"managed":"yes"},"deletionTimestamp":"2026-11-21T10:00:00Z"}}`, ""),
			wantAllowed: true},
		{name: "a review without an operation is a 400", req: request("", "", ""), wantCode: http.StatusBadRequest},
		{name: "garbage is a 400", req: request(admissionv1.Create, `{"kind":`, ""), wantCode: http.StatusBadRequest},
		{name: "wrong kind is a 400", req: request(admissionv1.Create, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, ""), wantCode: http.StatusBadRequest},
		{name: "missing object is a 400", req: request(admissionv1.Create, "", ""), wantCode: http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := h.Handle(context.Background(), tt.req)
			if resp.Allowed != tt.wantAllowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.wantAllowed, resp.Result)
			}
			if tt.wantCode != 0 && (resp.Result == nil || resp.Result.Code != tt.wantCode) {
				t.Fatalf("result = %+v, want code %d", resp.Result, tt.wantCode)
			}
			got, _ := json.Marshal(resp.Patches)
			want, _ := json.Marshal(tt.wantPatch)
			if len(tt.wantPatch) == 0 && len(resp.Patches) == 0 {
				return
			}
			if string(got) != string(want) {
				t.Fatalf("patches = %s, want %s", got, want)
			}
		})
	}
}

func TestDeleteHandlerRejectsBadRequests(t *testing.T) {
	h := &DeleteHandler{}
	tests := []struct{ name, oldObject, wantMessage string }{
		{"missing oldObject", "", "admission request has no oldObject"},
		{"garbage JSON", `{"metadata":`, "decoding oldObject as a Node"},
		{"wrong kind", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}`, "oldObject is a v1 Secret, not a v1 Node"},
		{"huge value", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + strings.Repeat("n", 1<<20) + `","labels":{"x":1}}}`, "decoding oldObject as a Node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := h.Handle(context.Background(), request(admissionv1.Delete, "", tt.oldObject))
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest || !strings.Contains(resp.Result.Message, tt.wantMessage) {
				t.Fatalf("response = %+v, want a 400 containing %q", resp.Result, tt.wantMessage)
			}
		})
	}
}
