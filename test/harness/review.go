package harness

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// PostReview posts an AdmissionReview straight to a webhook server at addr
// (host:port) and path, as any pod that reaches the port could, and returns
// its answer; it fails the test unless one comes back.
func PostReview(t testing.TB, addr, path string, review *admissionv1.AdmissionReview) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // test server
	resp, err := httpClient.Post("https://"+addr+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("webhook server unreachable: %v", err)
	}
	defer resp.Body.Close()
	var answer admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || answer.Response == nil {
		t.Fatalf("HTTP %d, no AdmissionReview answer: %v", resp.StatusCode, err)
	}
	return answer.Response
}
