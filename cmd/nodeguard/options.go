package main

import (
	"flag"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/azure/taintwatch"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/internal/autoscaler"
	"github.com/nodeguard/nodeguard/internal/leader"
	"github.com/nodeguard/nodeguard/webhook"
)

// minGracefulShutdown is the shortest stop with a grace: on shutdown Go's HTTP
// server waits up to 6 s for connections opened but not yet used, which
// kube-apiserver's connection pool keeps to the webhook.
const minGracefulShutdown = 10 * time.Second

// options are the command-line flags of nodeguard.
type options struct {
	metricsAddr             string
	metricsSecure           bool
	probeAddr               string
	pprofAddr               string
	memoryLimitRatio        float64
	gracefulShutdown        time.Duration
	nodeSelector            string
	managed                 labels.Selector // --node-selector, parsed
	claimTimeout            time.Duration
	unconfirmedClaimTimeout time.Duration
	signalTaints            string
	outsideDrains           bool
	signalAdminState        string
	// signals are --signal-taints, --signal-admin-state and
	// --cluster-autoscaler-scale-down-hold, built once by validate and
	// handed to every component that reads them.
	signals     azure.Signals
	webhook     webhook.Flags
	autoscaler  autoscaler.Options
	azure       azure.Options
	taintWatch  taintwatch.Options
	termination finalizer.Flags
	leader      leader.Options
}

func (o *options) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443",
		"Address of the Prometheus metrics endpoint; \"0\" disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS, allowing only callers authorized by a SubjectAccessReview for GET /metrics. Set false to serve plain HTTP.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081",
		"Address of the /healthz and /readyz endpoints.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "0",
		"Address of Go's /debug/pprof endpoints (plain HTTP, no authentication: bind it to localhost or a port-forward only); \"0\" disables it.")
	fs.Float64Var(&o.memoryLimitRatio, "memory-limit-ratio", 0.9,
		"Fraction of the container's memory limit (its cgroup's) set as the Go runtime's soft memory limit, so that garbage collection tightens before the kernel kills the process at the limit; 0 leaves the runtime's default. GOMEMLIMIT, when set, wins.")
	o.webhook.BindFlags(fs)
	o.leader.BindFlags(fs)
	fs.StringVar(&o.nodeSelector, "node-selector", "",
		"Label selector of the nodes nodeguard manages (finalizer, budgets, drain), e.g. 'kubernetes.azure.com/mode=user'. Empty manages every node.")
	fs.DurationVar(&o.claimTimeout, "disruption-claim-timeout", budget.DefaultClaimTimeout,
		"How long a NodeDisruptionBudget keeps charging an admitted deletion whose node has not started deleting (a later admission step denied it) before giving it back.")
	fs.DurationVar(&o.unconfirmedClaimTimeout, "unconfirmed-claim-timeout", budget.DefaultUnconfirmedClaimTimeout,
		"How long after its admission a disruption claim may wait for its node to show the disruption under way (deleting, draining, or scaled down) before it is given back (Warning event DisruptionClaimUnconfirmed): "+
			"an admitted delete sets the node's deletionTimestamp within milliseconds, so such a claim is a delete a later admission step denied, or a forged admission review. "+
			"The node is read fresh from the API server first. The same timeout withdraws the charge of a drain nodeguard did not start when no eviction from the node was carried out, or asked again, since its charging eviction review (Warning event DrainChargeWithdrawn). 0 turns it off (only --disruption-claim-timeout applies); otherwise at least 5s (the webhook timeout) and below --disruption-claim-timeout, and raised to three times --delete-admission-timeout when lower (an admission that charged a budget is over by then).")
	o.autoscaler.BindFlags(fs)
	o.termination = finalizer.NewFlags()
	o.termination.BindFlags(fs)
	fs.StringVar(&o.signalTaints, "signal-taints", ngv1alpha1.FormatSignalTaints(ngv1alpha1.DefaultSignalTaints),
		"Taints that say a node is leaving (key or key=value, comma-separated; a value is the only one that counts): "+
			"while a node carries one, its load-balancer traffic is cut and NodeDisruptionBudgets count it unavailable. Empty: none.")
	fs.StringVar(&o.signalAdminState, "signal-admin-state", string(azure.SignalByNodeguard),
		"Who sets load-balancer admin state for the signal taints: 'nodeguard', or 'cloud-provider' when cloud-provider-azure sets it itself "+
			"(its design sets Down for the out-of-service, shutdown and spot-eviction taints). With 'cloud-provider' nodeguard still cuts the traffic of the nodes it drains. "+
			"Either way nodeguard never restores None on a node that carries a signal taint either of them honours.")
	fs.BoolVar(&o.outsideDrains, "outside-drains", true,
		"Count drains nodeguard did not start (kubectl drain, AKS upgrades, reboot daemons) against NodeDisruptionBudgets and cut their traffic first: "+
			"the first eviction from a cordoned node charges the node's budgets (429 while they have no room) until the node is schedulable and Ready again. "+
			"false admits every eviction and follows no such drain (the eviction webhook, if installed, then only answers 'allowed').")
	o.azure = azure.NewOptions()
	o.azure.BindFlags(fs)
	o.taintWatch = taintwatch.NewOptions()
	o.taintWatch.BindFlags(fs)
	fs.DurationVar(&o.gracefulShutdown, "graceful-shutdown-timeout", 30*time.Second,
		"How long to wait on SIGTERM for in-flight work to finish before exiting: 0 (exit at once) or at least 10s, "+
			"as the webhook server waits up to 6s for connections kube-apiserver opened but has not used yet. Keep it below the pod's terminationGracePeriodSeconds.")
}

// unconfirmedFloor is the shortest --unconfirmed-claim-timeout: three times
// --delete-admission-timeout.
func (o *options) unconfirmedFloor() time.Duration { return 3 * o.webhook.DeleteTimeout }

func (o *options) validate() error {
	if o.memoryLimitRatio < 0 || o.memoryLimitRatio > 1 {
		return fmt.Errorf("--memory-limit-ratio %v: want 0 (off) or a fraction up to 1", o.memoryLimitRatio)
	}
	table, err := ngv1alpha1.ParseSignalTaints(o.signalTaints)
	if err != nil {
		return fmt.Errorf("--signal-taints: %w", err)
	}
	mode, err := azure.ParseSignalAdminState(o.signalAdminState)
	if err != nil {
		return fmt.Errorf("--signal-admin-state %w", err)
	}
	o.signals = azure.Signals{Table: ngv1alpha1.NewSignals(table, o.autoscaler.Hold), Mode: mode}
	o.taintWatch.Signals = o.signals
	if o.managed, err = labels.Parse(o.nodeSelector); err != nil {
		return fmt.Errorf("--node-selector %q: %w", o.nodeSelector, err)
	}
	o.taintWatch.Managed = o.managed // the spot tainter taints managed nodes only
	if err := o.taintWatch.Validate(); err != nil {
		return err
	}
	if err := o.webhook.Validate(); err != nil {
		return err
	}
	if g := o.gracefulShutdown; g < 0 || (g > 0 && g < minGracefulShutdown) {
		return fmt.Errorf("--graceful-shutdown-timeout (%s) must be 0 (exit at once) or at least %s", g, minGracefulShutdown)
	}
	if err := o.termination.Validate(); err != nil {
		return err
	}
	if o.claimTimeout <= 0 {
		return fmt.Errorf("--disruption-claim-timeout (%s) must be positive", o.claimTimeout)
	}
	if u := o.unconfirmedClaimTimeout; u != 0 && u < o.unconfirmedFloor() {
		// An admission that charged a budget may still be running (and be run
		// again by the API server) until then: a give-back before it could let
		// the budget admit one more.
		o.unconfirmedClaimTimeout = o.unconfirmedFloor()
	}
	if u := o.unconfirmedClaimTimeout; u != 0 && (u < 5*time.Second || u >= o.claimTimeout) {
		return fmt.Errorf("--unconfirmed-claim-timeout (%s) must be 0 (off), or at least 5s (the webhook timeout) and below --disruption-claim-timeout (%s)", u, o.claimTimeout)
	}
	return o.leader.Validate()
}
