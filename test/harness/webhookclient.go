package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// webhookClientCert makes kube-apiserver present a client certificate to the
// local webhook server, as a cluster does whose admins harden webhooks: a CA
// (written to dir/ca.crt), a certificate it signs, a kubeconfig naming the
// webhook's host:port with that certificate, and the AdmissionConfiguration
// that points both webhook admission plugins at the kubeconfig. It returns
// the AdmissionConfiguration's path (--admission-control-config-file) and
// the CA's (nodeguard's --webhook-client-ca).
func webhookClientCert(dir, host string, port int) (admissionConfig, caFile string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	caKey, caCert, err := NewCertificate(&x509.Certificate{
		Subject: pkix.Name{CommonName: "webhook-client-ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	if err != nil {
		return "", "", err
	}
	key, cert, err := NewCertificate(&x509.Certificate{
		Subject:  pkix.Name{CommonName: "kube-apiserver-webhook-client"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	files := map[string][]byte{
		"ca.crt":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw}),
		"client.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		"client.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		// The user is named after the webhook's host:port (a Service's
		// webhooks: <service>.<namespace>.svc).
		"webhook.kubeconfig": fmt.Appendf(nil, `apiVersion: v1
kind: Config
users:
- name: %q
  user:
    client-certificate: %s
    client-key: %s
`, net.JoinHostPort(host, strconv.Itoa(port)), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")),
		"admission.yaml": fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
`, filepath.Join(dir, "webhook.kubeconfig")),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return "", "", err
		}
	}
	return filepath.Join(dir, "admission.yaml"), filepath.Join(dir, "ca.crt"), nil
}

// NewCertificate gives tmpl a new P-256 key, a serial and a validity from an
// hour ago for a day, and signs it with parent and its key, or self-signs it
// when parent is nil.
func NewCertificate(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, err
}
