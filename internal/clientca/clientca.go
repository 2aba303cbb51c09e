// Package clientca makes the webhook server require a client certificate
// signed by a CA bundle read from a file (--webhook-client-ca), so that only
// an API server configured to present one can post admission reviews. The
// file is read again when it changes, as the serving certificate is, so a
// rotated CA needs no restart.
package clientca

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Bundle is the CA bundle of one file, reloaded when the file changes.
type Bundle struct {
	path string

	mu    sync.Mutex
	stamp stamp
	pool  *x509.CertPool
}

// stamp tells whether a file changed: a Secret volume swaps a symlink, which
// gives the file read through it a new modification time.
type stamp struct {
	modTime time.Time
	size    int64
}

// Load reads the PEM bundle at path; it fails when the file is unreadable or
// holds no certificate.
func Load(path string) (*Bundle, error) {
	b := &Bundle{path: path}
	st, pool, err := read(path)
	if err != nil {
		return nil, err
	}
	b.stamp, b.pool = st, pool
	return b, nil
}

func read(path string) (stamp, *x509.CertPool, error) {
	info, err := os.Stat(path)
	if err != nil {
		return stamp{}, nil, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return stamp{}, nil, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return stamp{}, nil, fmt.Errorf("--webhook-client-ca %s: no PEM certificate in it", path)
	}
	return stamp{modTime: info.ModTime(), size: info.Size()}, pool, nil
}

// Pool returns the CAs of the file as it is now. When the file changed but
// cannot be read (a rotation half done), it keeps the previous CAs and tries
// again on the next call.
func (b *Bundle) Pool() *x509.CertPool {
	b.mu.Lock()
	defer b.mu.Unlock()
	info, err := os.Stat(b.path)
	if err != nil || (stamp{modTime: info.ModTime(), size: info.Size()}) == b.stamp {
		return b.pool
	}
	st, pool, err := read(b.path)
	if err != nil {
		ctrl.Log.Error(err, "Keeping the previous webhook client CA", "path", b.path)
		return b.pool
	}
	b.stamp, b.pool = st, pool
	ctrl.Log.Info("Reloaded the webhook client CA", "path", b.path)
	return pool
}

// RequireClientCert is a webhook server TLS option: every connection must
// present a client certificate that the bundle's current CAs verify, or the
// TLS handshake fails before any admission review is read.
func (b *Bundle) RequireClientCert(c *tls.Config) {
	c.ClientAuth = tls.RequireAndVerifyClientCert
	c.ClientCAs = b.Pool()
	// The server's config gets its GetCertificate after the options ran, so
	// each handshake clones it then, with the CAs of the moment.
	server := c
	c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := server.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientCAs = b.Pool()
		return cfg, nil
	}
}

// QuietLoopbackHandshakeErrors keeps net/http from logging a TLS handshake
// that fails from a loopback address: with a client CA, the webhook's
// readiness check (a TLS dial of its own, without a client certificate, at
// every probe) fails that way by design. Handshakes failing from any other
// address are still logged: they are callers without a certificate of the CA.
func QuietLoopbackHandshakeErrors(w io.Writer) {
	log.SetOutput(loopbackHandshakeFilter{w})
}

type loopbackHandshakeFilter struct{ w io.Writer }

var loopbackHandshakeErrors = [][]byte{
	[]byte("http: TLS handshake error from 127.0.0.1:"),
	[]byte("http: TLS handshake error from [::1]:"),
}

// Write drops a whole line of the log package (one Write per line).
func (f loopbackHandshakeFilter) Write(p []byte) (int, error) {
	for _, prefix := range loopbackHandshakeErrors {
		if bytes.Contains(p, prefix) {
			return len(p), nil
		}
	}
	return f.w.Write(p)
}
