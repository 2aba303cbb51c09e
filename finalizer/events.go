package finalizer

// Event reasons of the termination, on the Node (kubectl describe node shows
// them in order).
const (
	ReasonWaitingForMaintenanceHold = "WaitingForMaintenanceHold"
	ReasonMaintenanceLeaseAcquired  = "MaintenanceLeaseAcquired"
	ReasonCordoned                  = "CordonedForTermination"
	ReasonTrafficCut                = "TrafficCut"
	// ReasonTrafficCutTimedOut (Warning): Azure did not confirm AdminState
	// Down within --admin-state-timeout; traffic is not known to be cut.
	ReasonTrafficCutTimedOut = "TrafficCutTimedOut"
	// ReasonTrafficCutFailed (Warning): setting AdminState Down failed for
	// good in a backend pool (a terminal ARM error, retries exhausted, a
	// NIC-only pool); traffic is not cut there.
	ReasonTrafficCutFailed       = "TrafficCutFailed"
	ReasonWaitingForDrainSlot    = "WaitingForDrainSlot"
	ReasonDrainWaiting           = "DrainWaiting"
	ReasonPodUnderMultiplePDBs   = "PodUnderMultiplePDBs"
	ReasonDoNotEvictPodBlocking  = "DoNotEvictPodBlocking"
	ReasonPodGivenUp             = "DrainGaveUpOnPod"
	ReasonEvictingBarePod        = "EvictingPodWithoutController"
	ReasonEvictingLocalData      = "EvictingPodWithLocalData"
	ReasonDrainDeadlineExceeded  = "DrainDeadlineExceeded"
	ReasonDrainBlockedByBudget   = "DrainBlockedByBudget"
	ReasonWaitingForReplacement  = "WaitingForReplacement"
	ReasonReplacementStalled     = "ReplacementStalled"
	ReasonDrained                = "Drained"
	ReasonWaitingForVolumeDetach = "WaitingForVolumeDetach"
	ReasonVolumeDetachTimedOut   = "VolumeDetachTimedOut"
	ReasonReleased               = "NodeReleased"
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
