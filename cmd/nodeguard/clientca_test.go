package main_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/test/harness"
)

// testCA is a certificate authority of a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, cert, err := harness.NewCertificate(&x509.Certificate{
		Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// clientCert issues a client certificate, as an API server presents to webhooks.
func (ca *testCA) clientCert(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, cert, err := harness.NewCertificate(&x509.Certificate{
		Subject:  pkix.Name{CommonName: cn},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca.cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key}
}

// deleteReview is the AdmissionReview an API server posts for kubectl delete
// node: what a forged review copies.
func deleteReview(t *testing.T, node string) []byte {
	t.Helper()
	old, err := json.Marshal(&corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: node}})
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("forged-" + node), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Node"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "nodes"}, Name: node,
			Operation: admissionv1.Delete, OldObject: runtime.RawExtension{Raw: old},
			UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:default:forger"},
		},
	}
	b, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// postReview posts the review over HTTPS with the client certificate (none
// when nil) and returns the UID the webhook answered for, or the transport
// error.
func postReview(addr string, cert *tls.Certificate, review []byte) (types.UID, error) {
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the server's certificate is not what this test checks
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := c.Post("https://"+addr+"/validate-node-delete", "application/json", bytes.NewReader(review))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var answer admissionv1.AdmissionReview
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &answer) != nil || answer.Response == nil {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return answer.Response.UID, nil
}

// TestWebhookClientCARefusesCallersWithoutItsCertificate posts raw admission
// reviews to a nodeguard started with --webhook-client-ca: without a client
// certificate, or with one another CA signed, the TLS handshake fails and no
// review is read; with a certificate the CA signed, the review is answered.
// A rotated CA file is used without a restart.
func TestWebhookClientCARefusesCallersWithoutItsCertificate(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	certDir := t.TempDir()
	writeCert(t, certDir, "serving")
	apiserverCA, otherCA := newTestCA(t, "apiserver-webhook-client-ca"), newTestCA(t, "another-ca")
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	writeAtomically(t, caFile, apiserverCA.pem())
	port := harness.FreePort(t)
	r := startReplica(t, "--leader-elect=false", fmt.Sprintf("--webhook-port=%d", port), "--webhook-cert-dir="+certDir, "--webhook-client-ca="+caFile)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := r.WaitServing(addr, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	review := deleteReview(t, "forged-target")
	apiserver := apiserverCA.clientCert(t, "kube-apiserver")
	other := otherCA.clientCert(t, "forger")

	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		uid, _ := postReview(addr, &apiserver, review)
		return uid == "forged-forged-target", nil
	}, "a review from a caller with a certificate of the client CA is answered")
	for what, cert := range map[string]*tls.Certificate{"no client certificate": nil, "a certificate of another CA": &other} {
		uid, err := postReview(addr, cert, review)
		if err == nil || !strings.Contains(err.Error(), "tls:") {
			t.Errorf("posting a review with %s: answered %q, error %v; want a TLS handshake failure", what, uid, err)
		}
	}

	// Rotation: the file now holds the other CA only.
	writeAtomically(t, caFile, otherCA.pem())
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		uid, _ := postReview(addr, &other, review)
		return uid == "forged-forged-target", nil
	}, "after the CA file changed, a certificate of the new CA is accepted")
	if uid, err := postReview(addr, &apiserver, review); err == nil || !strings.Contains(err.Error(), "tls:") {
		t.Errorf("after the CA file changed, a certificate of the old CA: answered %q, error %v; want a TLS handshake failure", uid, err)
	}
}
