package finalizer

import (
	"flag"
	"fmt"
	"time"

	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
)

// Flags are the termination controller's command-line settings: its Options
// and how many evictions a draining node sends at once.
type Flags struct {
	Options
	// ParallelEvictions bounds the concurrent evictions, per draining node,
	// of pods no PodDisruptionBudget covers (drain.Evictor.Parallel).
	ParallelEvictions int
}

// NewFlags returns the defaults, ready for BindFlags.
func NewFlags() Flags {
	return Flags{Options: Options{
		AdminStateTimeout:   DefaultAdminStateTimeout,
		TrafficCutFailure:   TrafficCutFailureDrain,
		DaemonSets:          drain.DaemonSetsLast,
		StuckPodMargin:      DefaultStuckPodMargin,
		VolumeDetachTimeout: DefaultVolumeDetachTimeout,
		MaxConcurrentNodes:  DefaultMaxConcurrentNodes,
		// Replacement first needs patch on every Deployment, which the
		// shipped manifests and chart grant only when asked.
		BlockedPDBPolicy:   drain.BlockedPDBWait,
		BlockedPDBSettle:   DefaultBlockedPDBSettle,
		ReplacementTimeout: DefaultReplacementTimeout,
		StatusSettle:       DefaultStatusSettle,
	}, ParallelEvictions: DefaultParallelEvictions}
}

// BindFlags registers the termination flags on fs. Set defaults first
// (NewFlags).
func (f *Flags) BindFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.AdminStateTimeout, "admin-state-timeout", f.AdminStateTimeout,
		"How long a drain waits for Azure to confirm the node's load-balancer AdminState Down; past it the drain continues with a Warning event, so an ARM outage never wedges it.")
	fs.StringVar((*string)(&f.TrafficCutFailure), "traffic-cut-failure", string(f.TrafficCutFailure),
		"What a drain does when the node's load-balancer traffic cut failed for good (a terminal ARM error, retries exhausted, a NIC-only pool) or was not confirmed within --admin-state-timeout: "+
			"'drain' goes on (a misconfigured Azure must not hold every node delete), saying so in the node condition nodeguard.io/TrafficCut, a Warning event and nodeguard_traffic_cuts_total; "+
			"'wait' holds the drain until Azure confirms Down (the admin-state resync retries the write).")
	fs.DurationVar(&f.CutoverPause, "cutover-pause", f.CutoverPause,
		"Pause between the confirmed traffic cut and the first eviction, for in-flight requests to finish.")
	fs.StringVar((*string)(&f.DaemonSets), "daemonset-pods", string(f.DaemonSets),
		"What a drain does with DaemonSet pods: 'last' evicts each once, after every other pod is gone (the replacements its DaemonSet puts back are ignored), 'skip' leaves them. Pods that tolerate the draining and unschedulable taints are likewise evicted once, last.")
	fs.DurationVar(&f.DrainTimeout, "drain-timeout", f.DrainTimeout,
		"Deadline of a drain, counted from the node's deletion; 0 means none. Past it the remaining pods are deleted without regard to PodDisruptionBudgets or do-not-evict (Warning event DrainDeadlineExceeded). A node annotation nodeguard.io/drain-timeout overrides it.")
	fs.DurationVar(&f.StuckPodMargin, "stuck-pod-margin", f.StuckPodMargin,
		"How long past its grace period a terminating pod holds its node; then the drain stops waiting for it (Warning event DrainGaveUpOnPod) and the pod garbage collector finishes it once the node is gone. 0 waits forever. On an unreachable node (Ready Unknown; not Ready with the cloud shutdown taint; or the out-of-service taint) terminating pods are waited for only 5s.")
	fs.StringVar((*string)(&f.BlockedPDBPolicy), "blocked-pdb-policy", string(f.BlockedPDBPolicy),
		"What a drain does about pods whose PodDisruptionBudget allows no disruption although every pod it expects is healthy (blocked by design: one replica under minAvailable: 1). "+
			"'replace' restarts their Deployment as kubectl rollout restart does, when its rolling update surges and cannot take the PDB below its desired healthy count, so that new pods start elsewhere before the old ones stop; 'wait' waits for the PDB. "+
			"StatefulSets, pods without a Deployment and Deployments with maxSurge 0 always wait. The annotation nodeguard.io/blocked-pdb-policy on a Deployment or PDB overrides it. "+
			"The default is 'wait', as in the shipped manifests and chart: 'replace' needs patch on Deployments in every namespace, which they grant only when asked (components/blocked-pdb-replace, Helm nodeguard.blockedPDBPolicy).")
	fs.DurationVar(&f.BlockedPDBSettle, "blocked-pdb-settle", f.BlockedPDBSettle,
		"How long a PodDisruptionBudget must stay blocked by design before the drain acts on it (at least 1s).")
	fs.DurationVar(&f.ReplacementTimeout, "replacement-timeout", f.ReplacementTimeout,
		"How long a new pod of a restarted Deployment may stay unscheduled or not Ready before the replacement counts as stalled: the drain then falls back to waiting for the PDB (Warning event ReplacementStalled), and --drain-timeout applies to those pods again. 0 never gives up.")
	fs.DurationVar(&f.VolumeDetachTimeout, "volume-detach-timeout", f.VolumeDetachTimeout,
		"After the drain, how long to wait for the node's VolumeAttachments to go before releasing it; 0 does not wait.")
	fs.IntVar(&f.MaxConcurrentNodes, "max-concurrent-drains", f.MaxConcurrentNodes,
		"Nodes terminated in parallel.")
	fs.IntVar(&f.ParallelEvictions, "parallel-evictions", f.ParallelEvictions,
		"Concurrent evictions, per draining node, of pods that no PodDisruptionBudget covers (pods under a PDB are always evicted one at a time per PDB).")
}

// Validate reports the first flag whose value cannot be used.
func (f *Flags) Validate() error {
	if f.DaemonSets != drain.DaemonSetsLast && f.DaemonSets != drain.DaemonSetsSkip {
		return fmt.Errorf("--daemonset-pods %q: must be 'last' or 'skip'", f.DaemonSets)
	}
	if f.TrafficCutFailure != TrafficCutFailureDrain && f.TrafficCutFailure != TrafficCutFailureWait {
		return fmt.Errorf("--traffic-cut-failure %q: must be 'drain' or 'wait'", f.TrafficCutFailure)
	}
	if _, err := drain.ParseBlockedPDBPolicy(string(f.BlockedPDBPolicy)); err != nil {
		return fmt.Errorf("--blocked-pdb-policy: %w", err)
	}
	if f.BlockedPDBSettle < time.Second || f.ReplacementTimeout < 0 {
		return fmt.Errorf("--blocked-pdb-settle (%s) must be at least 1s; --replacement-timeout must not be negative", f.BlockedPDBSettle)
	}
	if f.AdminStateTimeout <= 0 || f.DrainTimeout < 0 || f.VolumeDetachTimeout < 0 || f.CutoverPause < 0 || f.StuckPodMargin < 0 {
		return fmt.Errorf("--admin-state-timeout must be positive; --drain-timeout, --volume-detach-timeout, --stuck-pod-margin and --cutover-pause must not be negative")
	}
	if f.MaxConcurrentNodes < 1 || f.ParallelEvictions < 1 {
		return fmt.Errorf("--max-concurrent-drains and --parallel-evictions must be at least 1")
	}
	return nil
}

// Foresight is what the warnings of an admitted delete need of the drain's
// settings, so that they foresee the drain these flags run.
func (f *Flags) Foresight() *foresight.Settings {
	return &foresight.Settings{BlockedPDBPolicy: f.BlockedPDBPolicy, DrainTimeout: f.DrainTimeout, DaemonSets: f.DaemonSets}
}
