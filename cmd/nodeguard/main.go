// Command nodeguard makes node removal safe: an admission webhook that holds
// node deletions to NodeDisruptionBudgets, and controllers that cut load-balancer
// traffic and drain a node before releasing it. Run with --help for the flags.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/leader"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

func main() {
	var opts options
	opts.bind(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Usage = usage
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := opts.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "nodeguard:", err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		ctrl.Log.Error(err, "nodeguard stopped")
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintf(flag.CommandLine.Output(), `nodeguard makes node removal safe: it admits a node deletion only within every
NodeDisruptionBudget, then cuts the node's load-balancer traffic and drains it
serially per PodDisruptionBudget before releasing it.

Usage: nodeguard [flags]

Flags:
`)
	flag.PrintDefaults()
}

func run(opts options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	leaseKey := types.NamespacedName{Namespace: opts.leaderNamespace, Name: opts.leaderID}
	mgr, err := ctrl.NewManager(cfg, managerOptions(opts, leaseKey))
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := leader.Setup(mgr, leaseKey); err != nil {
		return err
	}
	if err := setupGuard(mgr, opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	readyz := healthz.Ping
	if opts.webhookPort >= 0 {
		readyz = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("webhook", readyz); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// setupGuard adds the admission webhooks, the finalizer backfill and the
// NodeDisruptionBudget status controller.
func setupGuard(mgr ctrl.Manager, opts options) error {
	managed, _ := labels.Parse(opts.nodeSelector) // validated
	if opts.webhookPort >= 0 {
		ngwebhook.Register(mgr, ngwebhook.Options{Managed: managed, DeleteTimeout: opts.deleteTimeout})
	}
	if err := ngwebhook.SetupBackfill(mgr, managed); err != nil {
		return err
	}
	return (&budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: opts.claimTimeout}).SetupWithManager(mgr)
}

func managerOptions(opts options, lease types.NamespacedName) ctrl.Options {
	// HTTP/2 is off for the webhook and metrics servers (CVE-2023-44487/39325);
	// TLS 1.2 is the minimum.
	tlsOpts := []func(*tls.Config){func(c *tls.Config) {
		c.NextProtos = []string{"http/1.1"}
		c.MinVersion = tls.VersionTLS12
	}}
	metrics := metricsserver.Options{BindAddress: opts.metricsAddr, SecureServing: opts.metricsSecure, TLSOpts: tlsOpts}
	if opts.metricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return ctrl.Options{
		Scheme:                        newScheme(),
		Metrics:                       metrics,
		HealthProbeBindAddress:        opts.probeAddr,
		WebhookServer:                 webhook.NewServer(webhook.Options{Port: opts.webhookPort, CertDir: opts.webhookCertDir, TLSOpts: tlsOpts}),
		LeaderElection:                opts.leaderElect,
		LeaderElectionNamespace:       lease.Namespace,
		LeaderElectionID:              lease.Name,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(opts.leaseDuration),
		RenewDeadline:                 ptr.To(opts.renewDeadline),
		RetryPeriod:                   ptr.To(opts.retryPeriod),
		GracefulShutdownTimeout:       ptr.To(opts.gracefulShutdown),
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only the Leases nodeguard reads: its election Lease (and, later,
			// node maintenance Leases), never every node's heartbeat Lease.
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{lease.Namespace: {}}},
		}},
	}
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(ngv1alpha1.AddToScheme(s))
	return s
}
