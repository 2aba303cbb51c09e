package main

import (
	"bytes"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/nodeguard/nodeguard/test/bench"
)

func TestClassifyNamesRequestsLikeTheAPIServer(t *testing.T) {
	tests := []struct {
		method, target string
		verb, resource string
	}{
		{"GET", "/api/v1/nodes", "LIST", "nodes"},
		{"GET", "/api/v1/nodes?watch=true&resourceVersion=1", "WATCH", "nodes"},
		{"GET", "/api/v1/nodes/n1", "GET", "nodes"},
		{"PATCH", "/api/v1/nodes/n1/status", "PATCH", "nodes/status"},
		{"DELETE", "/api/v1/nodes/n1", "DELETE", "nodes"},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "LIST", "pods"},
		{"GET", "/api/v1/namespaces", "LIST", "namespaces"},
		{"GET", "/api/v1/namespaces/ns", "GET", "namespaces"},
		{"POST", "/api/v1/namespaces/ns/pods/web-1/eviction", "CREATE", "pods/eviction"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-maintenance/leases/n1", "UPDATE", "leases"},
		{"PUT", "/apis/nodeguard.io/v1alpha1/nodedisruptionbudgets/all/status", "UPDATE", "nodedisruptionbudgets/status"},
		{"GET", "/apis/apps/v1/namespaces/ns/deployments?watch=1", "WATCH", "deployments"},
		{"GET", "/api", "GET", "/api"},
		{"GET", "/version", "GET", "/version"},
	}
	for _, tt := range tests {
		verb, resource := classify(httptest.NewRequest(tt.method, tt.target, nil))
		if verb != tt.verb || resource != tt.resource {
			t.Errorf("%s %s = %s %s, want %s %s", tt.method, tt.target, verb, resource, tt.verb, tt.resource)
		}
	}
}

func TestRequestCountSinceKeepsOnlyWhatCameAfter(t *testing.T) {
	earlier := requestCount{Requests: map[string]int{"LIST pods": 3, "WATCH nodes": 1}, Evictions: map[int]int{200: 2}}
	later := requestCount{Requests: map[string]int{"LIST pods": 5, "WATCH nodes": 1, "CREATE pods/eviction": 4}, Evictions: map[int]int{200: 5, 429: 1}}
	d := later.since(earlier)
	if d.total() != 6 || d.Requests["LIST pods"] != 2 || d.Requests["CREATE pods/eviction"] != 4 {
		t.Errorf("since = %v, want 2 LIST pods and 4 evictions", d.Requests)
	}
	if _, ok := d.Requests["WATCH nodes"]; ok {
		t.Error("since kept a kind with no new request")
	}
	if d.evictionRequests() != 4 || d.Evictions[429] != 1 {
		t.Errorf("evictions = %v, want 3 answered 200 and 1 answered 429", d.Evictions)
	}
}

func TestDropsBelowCountsEachDescent(t *testing.T) {
	pts := []bench.Point{{V: 10}, {V: 9}, {V: 8}, {V: 7}, {V: 9}, {V: 8}, {V: 10}}
	if got := dropsBelow(pts, 9); got != 2 {
		t.Errorf("dropsBelow(…, 9) = %d, want 2 (8, 7 then 8)", got)
	}
	if got := dropsBelow(pts, 7); got != 0 {
		t.Errorf("dropsBelow(…, 7) = %d, want 0", got)
	}
}

func TestWriteReasonNamesStatusAndEventWrites(t *testing.T) {
	tests := []struct {
		method, target, body string
		want                 string
	}{
		{"PATCH", "/api/v1/nodes/n1/status",
			`{"status":{"conditions":[{"type":"nodeguard.io/TrafficCut","status":"True"},{"type":"nodeguard.io/Terminating","status":"True","reason":"WaitingForDrainSlot"}]}}`,
			"status WaitingForDrainSlot"},
		{"PATCH", "/api/v1/nodes/n1/status",
			`{"status":{"conditions":[{"type":"Drained","status":"True"},{"$patch":"delete","type":"nodeguard.io/Terminating"}]}}`,
			"status Drained,-nodeguard.io/Terminating"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/default/events", `{"apiVersion":"events.k8s.io/v1","kind":"Event","reason":"NodeReleased","note":"released"}`, "event NodeReleased"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/default/events", protobufEvent(t, "NodeDeletionAdmitted"), "event NodeDeletionAdmitted"},
		{"PATCH", "/apis/events.k8s.io/v1/namespaces/default/events/e1", `{"series":{"count":2}}`, "event series"},
		{"PATCH", "/api/v1/nodes/n1", `{"spec":{"unschedulable":true}}`, ""},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.target, strings.NewReader(tt.body))
		verb, resource := classify(r)
		if got := writeReason(r, verb, resource); got != tt.want {
			t.Errorf("%s %s = %q, want %q", tt.method, tt.target, got, tt.want)
		}
		if body, _ := io.ReadAll(r.Body); string(body) != tt.body {
			t.Errorf("%s %s: the body left for the proxy is %q, want it whole", tt.method, tt.target, body)
		}
	}
}

// protobufEvent is an events.k8s.io/v1 Event as a client sending protobuf
// writes it.
func protobufEvent(t *testing.T, reason string) string {
	t.Helper()
	var b bytes.Buffer
	ev := &eventsv1.Event{TypeMeta: metav1.TypeMeta{APIVersion: "events.k8s.io/v1", Kind: "Event"}, Reason: reason}
	if err := protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme).Encode(ev, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
