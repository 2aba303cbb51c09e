package finalizer

import (
	"time"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// Defaults of the termination options.
const (
	DefaultAdminStateTimeout   = 30 * time.Second
	DefaultVolumeDetachTimeout = time.Minute
	DefaultMaxConcurrentNodes  = 10
	// DefaultParallelEvictions sends a typical node's unprotected pods in
	// one wave, as kubectl drain does: under a fleet's drain each eviction
	// round trip is slow, and a second wave doubles the drain.
	DefaultParallelEvictions = 50
	// DefaultDrainBackstop is how long a drain whose pods and PDBs are
	// watched waits without news before it looks again: for what only time
	// changes (a pod stuck past its grace period, an unreachable node's
	// margin), and a 429 that no PDB change will follow.
	DefaultDrainBackstop = 5 * time.Second
	// DefaultStatusSettle is how long a change of a terminating node's
	// conditions waits before it is written.
	DefaultStatusSettle = 3 * time.Second
)

// DefaultStuckPodMargin is Karpenter's rule for a pod stuck terminating.
const DefaultStuckPodMargin = time.Minute

// Options configure termination.
type Options struct {
	// Identity names this replica in maintenance Leases (nodeguard/<identity>).
	Identity string
	// AdminStateTimeout bounds the wait for Azure to confirm Down.
	AdminStateTimeout time.Duration
	// TrafficCutFailure is what the drain does when the traffic cut failed or
	// was not confirmed within AdminStateTimeout (empty: drain).
	TrafficCutFailure TrafficCutFailurePolicy
	// CutoverPause waits after traffic is cut, for in-flight requests.
	CutoverPause time.Duration
	// DaemonSets is what happens to DaemonSet pods.
	DaemonSets drain.DaemonSetPolicy
	// DrainTimeout, if positive, is the drain deadline counted from deletion;
	// the node annotation nodeguard.io/drain-timeout overrides it. Past it the
	// remaining pods are deleted without regard to PDBs or do-not-evict.
	DrainTimeout time.Duration
	// StuckPodMargin is how long past its grace period a terminating pod is
	// waited for; then it no longer holds the node (0: forever).
	StuckPodMargin time.Duration
	// VolumeDetachTimeout bounds the wait for VolumeAttachments; 0 skips it.
	VolumeDetachTimeout time.Duration
	// MaxConcurrentNodes bounds the nodes that drain at once (drainSlots);
	// 0 leaves drains unbounded.
	MaxConcurrentNodes int
	// BlockedPDBPolicy is what a drain does about pods under a PDB blocked by
	// design (empty: replace); annotations on a Deployment or PDB override it.
	BlockedPDBPolicy drain.BlockedPDBPolicy
	// BlockedPDBSettle is how long a queue must stay blocked by design before
	// nodeguard acts on it.
	BlockedPDBSettle time.Duration
	// ReplacementTimeout is how long a restart's new pod may stay not Ready
	// before the replacement counts as stalled and the drain falls back to
	// waiting (0: never).
	ReplacementTimeout time.Duration
	// DrainBackstop overrides DefaultDrainBackstop.
	DrainBackstop time.Duration
	// StatusSettle is how long a change of a terminating node's conditions
	// waits before it is written, with whatever changed meanwhile: a wait
	// that ends sooner is never written (0: at the end of each pass).
	StatusSettle time.Duration
}
