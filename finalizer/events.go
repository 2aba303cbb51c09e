package finalizer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Event reasons of the termination, on the Node (kubectl describe node shows
// them in order).
//
// The steps every termination takes (the maintenance Lease held, the cordon,
// the traffic cut confirmed, the drain done) are not events of their own:
// they are said together in NodeReleased, and while the node waits its
// conditions say where it stands. Every event is a write, and a fleet's
// deletion pays each per node.
const (
	ReasonWaitingForMaintenanceHold = "WaitingForMaintenanceHold"
	// ReasonTrafficCutTimedOut (Warning): Azure did not confirm AdminState
	// Down within --admin-state-timeout; traffic is not known to be cut.
	ReasonTrafficCutTimedOut = "TrafficCutTimedOut"
	// ReasonTrafficCutFailed (Warning): setting AdminState Down failed for
	// good in a backend pool (a terminal ARM error, retries exhausted, a
	// NIC-only pool); traffic is not cut there.
	ReasonTrafficCutFailed      = "TrafficCutFailed"
	ReasonDrainWaiting          = "DrainWaiting"
	ReasonPodUnderMultiplePDBs  = "PodUnderMultiplePDBs"
	ReasonDoNotEvictPodBlocking = "DoNotEvictPodBlocking"
	ReasonPodGivenUp            = "DrainGaveUpOnPod"
	// ReasonEvictingBarePod and ReasonEvictingLocalData (Warning) name the
	// evicted pods no controller recreates and those whose emptyDir data
	// went, once the drain has lasted 30s; a drain that ends sooner names
	// them in NodeReleased, then a Warning (losses.go).
	ReasonEvictingBarePod        = "EvictingPodWithoutController"
	ReasonEvictingLocalData      = "EvictingPodWithLocalData"
	ReasonDrainDeadlineExceeded  = "DrainDeadlineExceeded"
	ReasonDrainBlockedByBudget   = "DrainBlockedByBudget"
	ReasonWaitingForReplacement  = "WaitingForReplacement"
	ReasonReplacementStalled     = "ReplacementStalled"
	ReasonWaitingForVolumeDetach = "WaitingForVolumeDetach"
	ReasonVolumeDetachTimedOut   = "VolumeDetachTimedOut"
	// ReasonReleased: the node is released; its note lists the steps taken
	// (a Warning when it names evicted pods a user may regret).
	ReasonReleased = "NodeReleased"
	// ReasonInstanceGone: a NotReady node whose VM is gone, released at once.
	ReasonInstanceGone = "InstanceGoneReleased"
	// ReasonReleasedToKarpenter: a Karpenter node, released after the traffic
	// cut without a drain (Karpenter drains it).
	ReasonReleasedToKarpenter = "ReleasedToKarpenter"

	actionTerminate = "TerminateNode"
)

// Event reasons on a Deployment nodeguard restarted.
const (
	ReasonRestartedForDrain = "RestartedForDrain"

	actionRestart = "RestartForDrain"
)

// progress records a step of the termination for the NodeReleased event.
func (r *Reconciler) progress(uid types.UID, format string, args ...any) {
	step := fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(uid)
	if !slices.Contains(m.done, step) {
		m.done = append(m.done, step)
	}
}

// releaseNote says how long the termination took, how its traffic cut ended
// (the TrafficCut condition as it stands, which a restart keeps) and the
// steps this process took, e.g. "released the node 3s after its deletion
// (traffic cut: load balancer AdminState Down confirmed ...): held
// maintenance Lease ...; cordoned and tainted ...; drained: every evictable
// pod is gone".
func (r *Reconciler) releaseNote(node *corev1.Node, what string) string {
	r.mu.Lock()
	done := slices.Clone(r.recall(node.UID).done)
	r.mu.Unlock()
	note := what
	if node.DeletionTimestamp != nil {
		note += fmt.Sprintf(" %s after its deletion", r.Clock.Since(node.DeletionTimestamp.Time).Round(time.Second))
	}
	switch c := nodeCondition(node, ngv1alpha1.TrafficCutCondition); {
	case c == nil:
	case c.Status == corev1.ConditionTrue:
		note += " (traffic cut: " + c.Message + ")"
	default:
		note += " (" + c.Message + ")"
	}
	if len(done) > 0 {
		note += ": " + strings.Join(done, "; ")
	}
	return note
}
