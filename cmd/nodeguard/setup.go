package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/azure/agentpools"
	"github.com/nodeguard/nodeguard/azure/taintwatch"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/internal/autoscaler"
	"github.com/nodeguard/nodeguard/karpenter"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// setupTermination adds the Azure admin-state manager (nil when Azure is not
// configured), the taint watcher and the termination controller.
// drainRule charges the drains nodeguard follows (shared with the eviction
// webhook).
func setupTermination(mgr ctrl.Manager, opts options, adminState *azure.Manager, drainRule *budget.Rule) error {
	opts.termination.Identity = identity()
	r := &finalizer.Reconciler{
		Client:   mgr.GetClient(),
		Reader:   mgr.GetAPIReader(),
		Evictor:  &drain.Evictor{Client: mgr.GetClient(), Parallel: opts.termination.ParallelEvictions, Observe: finalizer.ObserveEviction},
		Recorder: mgr.GetEventRecorder("nodeguard-termination"),
		Clock:    clock.RealClock{},
		Opts:     opts.termination.Options,
	}
	// Off, the drains charged before still end, their charges given back.
	r.Outside = &finalizer.OutsideDrains{Rule: drainRule, Managed: opts.managed, Off: !opts.outsideDrains,
		UnconfirmedTimeout: opts.unconfirmedClaimTimeout}
	if adminState == nil {
		ctrl.Log.Info("Azure is not configured: load-balancer admin state is off; budgets and drains work as usual")
	} else {
		if err := mgr.Add(adminState); err != nil {
			return err
		}
		r.AdminState = adminState
		r.Instances = &finalizer.CachedInstances{Checker: adminState, TTL: finalizer.DefaultInstanceCacheTTL, Clock: clock.RealClock{}}
	}
	if err := taintwatch.Setup(mgr, adminState, opts.taintWatch); err != nil {
		return fmt.Errorf("setting up the taint watcher: %w", err)
	}
	return r.SetupWithManager(mgr)
}

// identity names this replica: the pod name from the Downward API, else the host.
func identity() string {
	if name := os.Getenv("POD_NAME"); name != "" {
		return name
	}
	host, _ := os.Hostname()
	return host
}

// setupAgentPools adds the reads of the AKS agent pools' upgrade settings
// (--aks-managed-cluster, on every replica); nil when they are off.
func setupAgentPools(mgr ctrl.Manager, adminState *azure.Manager) (*agentpools.Poller, error) {
	if adminState == nil { // the configuration refuses the flag without Azure
		return nil, nil
	}
	p, err := agentpools.FromConfig(adminState.Config())
	if err != nil || p == nil {
		return nil, err
	}
	return p, mgr.Add(p)
}

// setupGuard adds the admission webhooks, the finalizer backfill, the
// release of nodes Karpenter left tainted after a denied NodeClaim delete, the
// cluster-autoscaler integration (the scale-down hold and the
// scale-down-disabled annotation) and the NodeDisruptionBudget status
// controller. rules decide every door; their claimer is shared by every
// budget write. upgrades (nil: off) gives the budget webhook and status
// controller the AKS agent pools' upgrade settings to judge.
func setupGuard(mgr ctrl.Manager, opts options, adminState *azure.Manager, rules budget.Rules, upgrades *agentpools.Poller) error {
	managed, claimer := opts.managed, rules.Deletion.Claimer
	if opts.webhook.Serving() {
		wo := ngwebhook.Options{Managed: managed, Rules: rules, Signals: opts.signals.Table, IgnoreOutsideDrains: !opts.outsideDrains,
			DeleteTimeout: opts.webhook.DeleteTimeout, WarningsWait: opts.webhook.WarningsWait, Drain: opts.termination.Foresight(),
			UpgradeNodeTime: opts.azure.UpgradeNodeTime}
		if adminState != nil {
			wo.Traffic = ngwebhook.TrafficGate{Enabled: true, Timeout: opts.termination.AdminStateTimeout,
				Wait: opts.termination.TrafficCutFailure == finalizer.TrafficCutFailureWait}
		}
		if upgrades != nil { // never a typed nil in the interface
			wo.Upgrades = upgrades
		}
		if err := ngwebhook.Register(mgr, wo); err != nil {
			return err
		}
	}
	// The finalizer's backfill and the webhooks' scope check; the release of
	// nodes Karpenter left tainted.
	if err := errors.Join(ngwebhook.SetupLeader(mgr, managed), karpenter.SetupRelease(mgr)); err != nil {
		return err
	}
	scaleDown := opts.autoscaler // --cluster-autoscaler-scale-down-hold
	scaleDown.Managed, scaleDown.Rule, scaleDown.Signals, scaleDown.AdminStateTimeout = managed, rules.Deletion, opts.signals, opts.termination.AdminStateTimeout
	if adminState != nil { // never a typed nil in the interface
		scaleDown.AdminState = adminState
	}
	if err := autoscaler.Setup(mgr, scaleDown); err != nil {
		return err
	}
	status := &budget.StatusReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Clock: clock.RealClock{},
		ClaimTimeout: opts.claimTimeout, UnconfirmedTimeout: opts.unconfirmedClaimTimeout,
		Recorder: mgr.GetEventRecorder("nodeguard-budget"), Claimer: claimer, Signals: opts.signals.Table,
		DisruptionPending: karpenter.NodeClaimDeleting(mgr.GetAPIReader()), UpgradeNodeTime: opts.azure.UpgradeNodeTime}
	if upgrades != nil { // never a typed nil in the interface
		status.Upgrades, status.UpgradeEvents = upgrades, upgrades.Events()
	}
	return status.SetupWithManager(mgr)
}

// The secure metrics endpoint authenticates scrapers with TokenReviews and
// authorizes them with SubjectAccessReviews.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// serverTLS is the TLS of the webhook and metrics servers: HTTP/2 is off
// (CVE-2023-44487/39325); TLS 1.2 is the minimum.
var serverTLS = []func(*tls.Config){func(c *tls.Config) {
	c.NextProtos = []string{"http/1.1"}
	c.MinVersion = tls.VersionTLS12
}}

// managerOptions configures the manager, with the webhook server built from
// the webhook's flags.
func managerOptions(opts options, lease types.NamespacedName, webhookServer webhook.Server) ctrl.Options {
	metrics := metricsserver.Options{BindAddress: opts.metricsAddr, SecureServing: opts.metricsSecure, TLSOpts: serverTLS}
	if opts.metricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	o := ctrl.Options{
		Scheme:                  newScheme(),
		Metrics:                 metrics,
		HealthProbeBindAddress:  opts.probeAddr,
		PprofBindAddress:        opts.pprofAddr,
		WebhookServer:           webhookServer,
		GracefulShutdownTimeout: ptr.To(opts.gracefulShutdown),
		Cache: cache.Options{
			// Managed fields are most of a Node's bytes and nodeguard never
			// reads them: dropping them keeps 5,000 cached nodes small.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Node{}: {Transform: trimNode},
				// Only the Leases nodeguard reads: its election Lease and node
				// maintenance Leases, never every node's heartbeat Lease.
				&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{
					lease.Namespace: {}, ngv1alpha1.MaintenanceLeaseNamespace: {},
				}},
			}},
	}
	opts.leader.Apply(&o)
	return o
}

// trimNode drops what nodeguard never reads of a cached Node: managed fields,
// the kubelet's inventory (capacity, allocatable, node info, images, volumes,
// daemon endpoints, config, features, runtime handlers) and its pressure
// conditions: about 30% of each of thousands of cached nodes. It keeps the
// metadata, the spec (taints, unschedulable, providerID), the Ready condition,
// the drain's (KEP-5683's DrainInProgress and Drained, and nodeguard's own),
// and the addresses (backend pool entries by IP).
// Patches are computed from two trimmed copies or written raw, so they never
// touch what was dropped; nodes are only updated through the spec and
// metadata, where nothing is dropped.
func trimNode(o any) (any, error) {
	o, err := cache.TransformStripManagedFields()(o)
	node, ok := o.(*corev1.Node)
	if err != nil || !ok {
		return o, err
	}
	conditions := slices.DeleteFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
		switch c.Type {
		case corev1.NodeReady, corev1.NodeDrainInProgress, corev1.NodeDrained:
			return false
		}
		return !strings.HasPrefix(string(c.Type), ngv1alpha1.GroupVersion.Group+"/")
	})
	node.Status = corev1.NodeStatus{Phase: node.Status.Phase, Conditions: slices.Clone(conditions), Addresses: node.Status.Addresses}
	return node, nil
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(ngv1alpha1.AddToScheme(s))
	return s
}
