package webhook

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/nodeguard/nodeguard/internal/clientca"
)

// maxWebhookTimeout is the largest timeoutSeconds a webhook configuration
// may have.
const maxWebhookTimeout = 30 * time.Second

// Flags are the command-line settings of the webhook server and of the
// doors' decisions; cmd/nodeguard binds them and hands DeleteTimeout and
// WarningsWait on through Options.
type Flags struct {
	// Port is --webhook-port; a negative port serves no webhook.
	Port int
	// CertDir is --webhook-cert-dir, the serving certificate's.
	CertDir string
	// ClientCA is --webhook-client-ca ("": any caller may connect).
	ClientCA string
	// DeleteTimeout is --delete-admission-timeout, the time budget of one
	// door's decision.
	DeleteTimeout time.Duration
	// WarningsWait is --delete-warnings-wait.
	WarningsWait time.Duration
}

// BindFlags registers the flags on fs.
func (f *Flags) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&f.Port, "webhook-port", 9443,
		"Port of the admission webhook server (HTTPS); a negative value disables it.")
	fs.StringVar(&f.CertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs",
		"Directory holding the webhook serving certificate as tls.crt and tls.key (for example a mounted cert-manager Secret); rotated files are reloaded without a restart.")
	fs.StringVar(&f.ClientCA, "webhook-client-ca", "",
		"PEM file of the CA(s) that sign the API server's client certificate for webhooks (kube-apiserver --admission-control-config-file). When set, the webhook server refuses, in the TLS handshake, every caller without a certificate they verify; a changed file is reloaded without a restart. Empty: any caller may connect (restrict it with the NetworkPolicy).")
	fs.DurationVar(&f.DeleteTimeout, "delete-admission-timeout", DefaultDeleteTimeout,
		"Time budget of one node DELETE, NodeClaim DELETE or eviction decision, including retries of conflicting budget claims; past it the request is denied with 429 'retry'. Keep it below those webhooks' timeoutSeconds (5 in the shipped manifests; the Helm chart derives both from webhook.timeoutSeconds), or the API server gives up first (and admits an eviction: its failurePolicy is Ignore).")
	fs.DurationVar(&f.WarningsWait, "delete-warnings-wait", DefaultWarningsWait,
		"How long an admitted node DELETE's answer waits, past its decision, for the warnings of what the node's drain will meet (kubectl prints them: blocked PDBs, do-not-evict pods, pods under several PDBs, pods without a controller or with emptyDir data, the drain deadline). They are computed while the delete is decided; those not ready in time are left out (nodeguard_delete_warnings_left_out_total). 0 turns them off.")
}

// Validate checks the decisions' time budget.
func (f *Flags) Validate() error {
	if f.DeleteTimeout <= 0 || f.DeleteTimeout >= maxWebhookTimeout {
		return fmt.Errorf("--delete-admission-timeout (%s) must be positive and below the longest webhook timeoutSeconds the API server allows (%s)", f.DeleteTimeout, maxWebhookTimeout)
	}
	return nil
}

// Serving reports whether this replica serves the webhooks.
func (f *Flags) Serving() bool { return f.Port >= 0 }

// NewServer returns the webhook server, with tlsOpts and, with
// --webhook-client-ca, the requirement of a client certificate its CAs
// signed. It fails when that file cannot be read.
func (f *Flags) NewServer(tlsOpts []func(*tls.Config)) (webhook.Server, error) {
	if f.ClientCA != "" {
		ca, err := clientca.Load(f.ClientCA)
		if err != nil {
			return nil, err
		}
		clientca.QuietLoopbackHandshakeErrors(os.Stderr)
		tlsOpts = append(slices.Clip(tlsOpts), ca.RequireClientCert)
	}
	return webhook.NewServer(webhook.Options{Port: f.Port, CertDir: f.CertDir, TLSOpts: tlsOpts}), nil
}
