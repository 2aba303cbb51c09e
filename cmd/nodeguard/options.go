package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/azure/taintwatch"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/webhook"
)

// maxWebhookTimeout is the largest timeoutSeconds a webhook configuration
// may have.
const maxWebhookTimeout = 30 * time.Second

// options are the command-line flags of nodeguard.
type options struct {
	metricsAddr             string
	metricsSecure           bool
	probeAddr               string
	pprofAddr               string
	memoryLimitRatio        float64
	webhookPort             int
	webhookCertDir          string
	leaderElect             bool
	leaderNamespace         string
	leaderID                string
	leaseDuration           time.Duration
	renewDeadline           time.Duration
	retryPeriod             time.Duration
	gracefulShutdown        time.Duration
	nodeSelector            string
	deleteTimeout           time.Duration
	claimTimeout            time.Duration
	unconfirmedClaimTimeout time.Duration
	adminStateTimeout       time.Duration
	cutoverPause            time.Duration
	daemonSets              string
	drainTimeout            time.Duration
	volumeDetachTimeout     time.Duration
	stuckPodMargin          time.Duration
	blockedPDBPolicy        string
	blockedPDBSettle        time.Duration
	replacementTimeout      time.Duration
	maxConcurrentDrains     int
	parallelEvictions       int
	signalTaints            string
	scaleDownHold           bool
	webhookClientCA         string
	trafficCutFailure       string
	signalAdminState        string
	// signals are --signal-taints, --signal-admin-state and
	// --cluster-autoscaler-scale-down-hold, built once by validate and
	// handed to every component that reads them.
	signals    azure.Signals
	azure      azure.Options
	taintWatch taintwatch.Options
}

// defaultNamespace is where nodeguard runs: the pod's namespace when the
// Downward API provides it, otherwise nodeguard-system.
func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "nodeguard-system"
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
	fs.IntVar(&o.webhookPort, "webhook-port", 9443,
		"Port of the admission webhook server (HTTPS); a negative value disables it.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs",
		"Directory holding the webhook serving certificate as tls.crt and tls.key (for example a mounted cert-manager Secret); rotated files are reloaded without a restart.")
	fs.StringVar(&o.webhookClientCA, "webhook-client-ca", "",
		"PEM file of the CA(s) that sign the API server's client certificate for webhooks (kube-apiserver --admission-control-config-file). When set, the webhook server refuses, in the TLS handshake, every caller without a certificate they verify; a changed file is reloaded without a restart. Empty: any caller may connect (restrict it with the NetworkPolicy).")
	fs.BoolVar(&o.leaderElect, "leader-elect", true,
		"Run the controllers only on the replica holding the leader election Lease. The webhook is served by every replica.")
	fs.StringVar(&o.leaderNamespace, "leader-election-namespace", defaultNamespace(),
		"Namespace of the leader election Lease (default: $POD_NAMESPACE, else nodeguard-system).")
	fs.StringVar(&o.leaderID, "leader-election-id", "nodeguard-leader",
		"Name of the leader election Lease.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long standbys wait before taking over a Lease the leader stopped renewing. A leader that shuts down gracefully releases it at once.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before it gives up leadership and exits.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second,
		"How often candidates try to acquire or renew the Lease.")
	fs.StringVar(&o.nodeSelector, "node-selector", "",
		"Label selector of the nodes nodeguard manages (finalizer, budgets, drain), e.g. 'kubernetes.azure.com/mode=user'. Empty manages every node.")
	fs.DurationVar(&o.deleteTimeout, "delete-admission-timeout", webhook.DefaultDeleteTimeout,
		"Time budget of one node DELETE decision, including retries of conflicting budget claims; past it the delete is denied with 429 'retry'. Keep it below the DELETE webhooks' timeoutSeconds (5 in the shipped manifests; the Helm chart derives both from webhook.timeoutSeconds), or the API server gives up first.")
	fs.DurationVar(&o.claimTimeout, "disruption-claim-timeout", budget.DefaultClaimTimeout,
		"How long a NodeDisruptionBudget keeps charging an admitted deletion whose node has not started deleting (a later admission step denied it) before giving it back.")
	fs.DurationVar(&o.unconfirmedClaimTimeout, "unconfirmed-claim-timeout", budget.DefaultUnconfirmedClaimTimeout,
		"How long after its admission a disruption claim may wait for its node to show the disruption under way (deleting, draining, or scaled down) before it is given back (Warning event DisruptionClaimUnconfirmed): "+
			"an admitted delete sets the node's deletionTimestamp within milliseconds, so such a claim is a delete a later admission step denied, or a forged admission review. "+
			"The node is read fresh from the API server first. 0 turns it off (only --disruption-claim-timeout applies); otherwise at least 5s (the webhook timeout) and below --disruption-claim-timeout, and raised to three times --delete-admission-timeout when lower (an admission that charged a budget is over by then).")
	fs.DurationVar(&o.adminStateTimeout, "admin-state-timeout", finalizer.DefaultAdminStateTimeout,
		"How long a drain waits for Azure to confirm the node's load-balancer AdminState Down; past it the drain continues with a Warning event, so an ARM outage never wedges it.")
	fs.StringVar(&o.trafficCutFailure, "traffic-cut-failure", string(finalizer.TrafficCutFailureDrain),
		"What a drain does when the node's load-balancer traffic cut failed for good (a terminal ARM error, retries exhausted, a NIC-only pool) or was not confirmed within --admin-state-timeout: "+
			"'drain' goes on (a misconfigured Azure must not hold every node delete), saying so in the node condition nodeguard.io/TrafficCut, a Warning event and nodeguard_traffic_cuts_total; "+
			"'wait' holds the drain until Azure confirms Down (the admin-state resync retries the write).")
	fs.DurationVar(&o.cutoverPause, "cutover-pause", 0,
		"Pause between the confirmed traffic cut and the first eviction, for in-flight requests to finish.")
	fs.StringVar(&o.daemonSets, "daemonset-pods", string(drain.DaemonSetsLast),
		"What a drain does with DaemonSet pods: 'last' evicts each once, after every other pod is gone (the replacements its DaemonSet puts back are ignored), 'skip' leaves them. Pods that tolerate the draining and unschedulable taints are likewise evicted once, last.")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 0,
		"Deadline of a drain, counted from the node's deletion; 0 means none. Past it the remaining pods are deleted without regard to PodDisruptionBudgets or do-not-evict (Warning event DrainDeadlineExceeded). A node annotation nodeguard.io/drain-timeout overrides it.")
	fs.DurationVar(&o.stuckPodMargin, "stuck-pod-margin", finalizer.DefaultStuckPodMargin,
		"How long past its grace period a terminating pod holds its node; then the drain stops waiting for it (Warning event DrainGaveUpOnPod) and the pod garbage collector finishes it once the node is gone. 0 waits forever. On an unreachable node (Ready Unknown; not Ready with the cloud shutdown taint; or the out-of-service taint) terminating pods are waited for only 5s.")
	fs.StringVar(&o.blockedPDBPolicy, "blocked-pdb-policy", string(drain.BlockedPDBWait),
		"What a drain does about pods whose PodDisruptionBudget allows no disruption although every pod it expects is healthy (blocked by design: one replica under minAvailable: 1). "+
			"'replace' restarts their Deployment as kubectl rollout restart does, when its rolling update surges and cannot take the PDB below its desired healthy count, so that new pods start elsewhere before the old ones stop; 'wait' waits for the PDB. "+
			"StatefulSets, pods without a Deployment and Deployments with maxSurge 0 always wait. The annotation nodeguard.io/blocked-pdb-policy on a Deployment or PDB overrides it. "+
			"The default is 'wait', as in the shipped manifests and chart: 'replace' needs patch on Deployments in every namespace, which they grant only when asked (components/blocked-pdb-replace, Helm nodeguard.blockedPDBPolicy).")
	fs.DurationVar(&o.blockedPDBSettle, "blocked-pdb-settle", finalizer.DefaultBlockedPDBSettle,
		"How long a PodDisruptionBudget must stay blocked by design before the drain acts on it (at least 1s).")
	fs.DurationVar(&o.replacementTimeout, "replacement-timeout", finalizer.DefaultReplacementTimeout,
		"How long a new pod of a restarted Deployment may stay unscheduled or not Ready before the replacement counts as stalled: the drain then falls back to waiting for the PDB (Warning event ReplacementStalled), and --drain-timeout applies to those pods again. 0 never gives up.")
	fs.DurationVar(&o.volumeDetachTimeout, "volume-detach-timeout", finalizer.DefaultVolumeDetachTimeout,
		"After the drain, how long to wait for the node's VolumeAttachments to go before releasing it; 0 does not wait.")
	fs.IntVar(&o.maxConcurrentDrains, "max-concurrent-drains", finalizer.DefaultMaxConcurrentNodes,
		"Nodes terminated in parallel.")
	fs.IntVar(&o.parallelEvictions, "parallel-evictions", finalizer.DefaultParallelEvictions,
		"Concurrent evictions, per draining node, of pods that no PodDisruptionBudget covers (pods under a PDB are always evicted one at a time per PDB).")
	fs.StringVar(&o.signalTaints, "signal-taints", ngv1alpha1.FormatSignalTaints(ngv1alpha1.DefaultSignalTaints),
		"Taints that say a node is leaving (key or key=value, comma-separated; a value is the only one that counts): "+
			"while a node carries one, its load-balancer traffic is cut and NodeDisruptionBudgets count it unavailable. Empty: none.")
	fs.StringVar(&o.signalAdminState, "signal-admin-state", string(azure.SignalByNodeguard),
		"Who sets load-balancer admin state for the signal taints: 'nodeguard', or 'cloud-provider' when cloud-provider-azure sets it itself "+
			"(its design sets Down for the out-of-service, shutdown and spot-eviction taints). With 'cloud-provider' nodeguard still cuts the traffic of the nodes it drains. "+
			"Either way nodeguard never restores None on a node that carries a signal taint either of them honours.")
	fs.BoolVar(&o.scaleDownHold, "cluster-autoscaler-scale-down-hold", true,
		"Charge cluster-autoscaler's scale-downs to NodeDisruptionBudgets: keep the annotation "+ngv1alpha1.DelayDeletionAnnotation+" on every managed node, "+
			"and remove it from a node tainted "+ngv1alpha1.ClusterAutoscalerTaintKey+" once every budget of the node admitted the scale-down and its traffic cut is confirmed. "+
			"cluster-autoscaler waits for it up to its --node-deletion-delay-timeout (2m by default) before it deletes the VM. false removes the annotations nodeguard set.")
	o.azure = azure.NewOptions()
	o.azure.BindFlags(fs)
	o.taintWatch = taintwatch.NewOptions()
	o.taintWatch.BindFlags(fs)
	fs.DurationVar(&o.gracefulShutdown, "graceful-shutdown-timeout", 30*time.Second,
		"How long to wait on SIGTERM for in-flight work to finish before exiting.")
}

// unconfirmedFloor is the shortest --unconfirmed-claim-timeout: three times
// --delete-admission-timeout.
func (o *options) unconfirmedFloor() time.Duration { return 3 * o.deleteTimeout }

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
	o.signals = azure.Signals{Table: ngv1alpha1.NewSignals(table, o.scaleDownHold), Mode: mode}
	o.taintWatch.Signals = o.signals
	if _, err := labels.Parse(o.nodeSelector); err != nil {
		return fmt.Errorf("--node-selector %q: %w", o.nodeSelector, err)
	}
	if o.deleteTimeout <= 0 || o.deleteTimeout >= maxWebhookTimeout {
		return fmt.Errorf("--delete-admission-timeout (%s) must be positive and below the longest webhook timeoutSeconds the API server allows (%s)", o.deleteTimeout, maxWebhookTimeout)
	}
	if o.daemonSets != string(drain.DaemonSetsLast) && o.daemonSets != string(drain.DaemonSetsSkip) {
		return fmt.Errorf("--daemonset-pods %q: must be 'last' or 'skip'", o.daemonSets)
	}
	if o.trafficCutFailure != string(finalizer.TrafficCutFailureDrain) && o.trafficCutFailure != string(finalizer.TrafficCutFailureWait) {
		return fmt.Errorf("--traffic-cut-failure %q: must be 'drain' or 'wait'", o.trafficCutFailure)
	}
	if _, err := drain.ParseBlockedPDBPolicy(o.blockedPDBPolicy); err != nil {
		return fmt.Errorf("--blocked-pdb-policy: %w", err)
	}
	if o.blockedPDBSettle < time.Second || o.replacementTimeout < 0 {
		return fmt.Errorf("--blocked-pdb-settle (%s) must be at least 1s; --replacement-timeout must not be negative", o.blockedPDBSettle)
	}
	if o.adminStateTimeout <= 0 || o.drainTimeout < 0 || o.volumeDetachTimeout < 0 || o.cutoverPause < 0 || o.stuckPodMargin < 0 {
		return fmt.Errorf("--admin-state-timeout must be positive; --drain-timeout, --volume-detach-timeout, --stuck-pod-margin and --cutover-pause must not be negative")
	}
	if o.maxConcurrentDrains < 1 || o.parallelEvictions < 1 {
		return fmt.Errorf("--max-concurrent-drains and --parallel-evictions must be at least 1")
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
	if o.leaderElect && o.leaderNamespace == "" {
		return fmt.Errorf("--leader-election-namespace must not be empty when --leader-elect is set")
	}
	if o.renewDeadline >= o.leaseDuration {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be shorter than --leader-elect-lease-duration (%s)", o.renewDeadline, o.leaseDuration)
	}
	if o.retryPeriod >= o.renewDeadline {
		return fmt.Errorf("--leader-elect-retry-period (%s) must be shorter than --leader-elect-renew-deadline (%s)", o.retryPeriod, o.renewDeadline)
	}
	return nil
}
