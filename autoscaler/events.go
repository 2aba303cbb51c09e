package autoscaler

// Event reasons of the cluster-autoscaler hold, on the Node (and, for claims,
// on the NodeDisruptionBudget).
const (
	// ReasonScaleDownClaimed: every budget of the node admitted its scale-down.
	ReasonScaleDownClaimed = "ScaleDownClaimed"
	// ReasonScaleDownDenied (Warning): a budget or a maintenance hold refused
	// the scale-down; the VM stays held and the claim is retried.
	ReasonScaleDownDenied = "ScaleDownDenied"
	// ReasonScaleDownReleased: the traffic cut is confirmed and the hold is
	// gone: cluster-autoscaler may delete the VM.
	ReasonScaleDownReleased = "ScaleDownReleased"
	// ReasonScaleDownTrafficCutTimedOut (Warning): Azure did not confirm Down
	// within --admin-state-timeout; the hold is released anyway.
	ReasonScaleDownTrafficCutTimedOut = "ScaleDownTrafficCutTimedOut"
	// ReasonScaleDownCancelled: cluster-autoscaler's taint went; the claim
	// was given back and the hold put back.
	ReasonScaleDownCancelled = "ScaleDownCancelled"
	// ReasonDisruptionClaimed, on a budget: it was charged with a scale-down.
	ReasonDisruptionClaimed = "DisruptionClaimed"
	// ReasonDisruptionDenied (Warning), on a budget: it refused a scale-down.
	ReasonDisruptionDenied = "DisruptionDenied"

	actionHold = "HoldScaleDown"
)
