// Command nodeguard makes node removal safe: an admission webhook that holds
// node deletions to NodeDisruptionBudgets, and controllers that cut load-balancer
// traffic and drain a node before releasing it. Run with --help for the flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/internal/buildinfo"
	"github.com/nodeguard/nodeguard/internal/leader"
	"github.com/nodeguard/nodeguard/internal/memlimit"
	"github.com/nodeguard/nodeguard/internal/recorder"
	"github.com/nodeguard/nodeguard/internal/uninstall"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
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
	webhookServer, err := opts.webhook.NewServer(serverTLS)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, managerOptions(opts, leaseKey, webhookServer))
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
	if err := ngwebhook.AddReadyzChecks(mgr, opts.webhook.Serving()); err != nil {
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
