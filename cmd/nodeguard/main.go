// Command nodeguard makes node removal safe: an admission webhook that holds
// node deletions to NodeDisruptionBudgets, and controllers that cut load-balancer
// traffic and drain a node before releasing it. Run with --help for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/internal/buildinfo"
	"github.com/nodeguard/nodeguard/internal/clientca"
	"github.com/nodeguard/nodeguard/internal/leader"
	"github.com/nodeguard/nodeguard/internal/memlimit"
	"github.com/nodeguard/nodeguard/internal/recorder"
	"github.com/nodeguard/nodeguard/internal/uninstall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "uninstall" {
		os.Exit(uninstall.Command(os.Args[2:], os.Stdout, newScheme()))
	}
	var opts options
	opts.bind(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Usage = usage
	flag.Parse()
	if *showVersion {
		fmt.Println(buildinfo.String())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	ctrl.Log.Info("Starting", "version", buildinfo.String())
	if err := opts.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "nodeguard:", err)
		os.Exit(2)
	}
	memlimit.SetAndLog(opts.memoryLimitRatio, ctrl.Log)
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
       nodeguard uninstall [flags]   (see nodeguard uninstall --help)
       nodeguard --version

Flags:
`)
	flag.PrintDefaults()
}

func run(opts options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	leaseKey := opts.leader.Lease()
	var clientCA *clientca.Bundle
	if opts.webhookClientCA != "" {
		if clientCA, err = clientca.Load(opts.webhookClientCA); err != nil {
			return err
		}
		clientca.QuietLoopbackHandshakeErrors(os.Stderr)
	}
	mgr, err := ctrl.NewManager(cfg, managerOptions(opts, leaseKey, clientCA))
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	mgr, events, err := recorder.ForManager(mgr)
	if err != nil {
		return err
	}
	if err := leader.Setup(mgr, leaseKey); err != nil {
		return err
	}
	adminState, err := azure.NewManager(opts.azure, mgr.GetEventRecorder("nodeguard-adminstate"),
		azure.InCluster(mgr.GetClient(), mgr.GetAPIReader())...)
	if err != nil {
		return fmt.Errorf("configuring Azure admin state: %w", err)
	}
	rules := newRules(mgr, opts, adminState)
	upgrades, err := setupAgentPools(mgr, adminState)
	if err != nil {
		return err
	}
	if err := setupGuard(mgr, opts, adminState, rules, upgrades); err != nil {
		return err
	}
	if err := setupTermination(mgr, opts, adminState, rules.Drain); err != nil {
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
	// The webhook server starts before the caches; until they sync, every
	// decision read from them waits out its time budget and answers
	// "retry", so a replica is not Ready (no Service traffic) before then.
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return err
	}
	err = mgr.Start(ctrl.SetupSignalHandler())
	// Events recorded just before the stop are still written.
	flushCtx, cancel := context.WithTimeout(context.Background(), opts.gracefulShutdown)
	defer cancel()
	if ferr := events.Flush(flushCtx); ferr != nil {
		ctrl.Log.Error(ferr, "Some events were not written before nodeguard stopped")
	}
	return err
}

// newRules builds, once, the rules every door decides by (budget.Rules), over
// one claimer for every budget write, so that they join one group commit:
// the deletion doors' rule reads maintenance Leases fresh; the drain rule
// reads none (whoever holds the Lease and drains is the drainer). With
// Azure, both ask ARM whether a NotReady node's VM is gone.
func newRules(mgr ctrl.Manager, opts options, adminState *azure.Manager) budget.Rules {
	var instances budget.InstanceChecker
	if adminState != nil { // never a typed nil in the interface
		instances = adminState
	}
	return budget.NewRules(budget.NewClaimer(mgr, opts.signals.Table), mgr.GetAPIReader(), instances, clock.RealClock{})
}

// cachesSynced is a readiness check that passes once the manager's informer
// caches have synced, and from then on without asking again.
func cachesSynced(c cache.Cache) healthz.Checker {
	var synced atomic.Bool
	return func(req *http.Request) error {
		if synced.Load() {
			return nil
		}
		ctx, cancel := context.WithTimeout(req.Context(), 100*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced yet")
		}
		synced.Store(true)
		return nil
	}
}
