package autoscaler

// Event reasons of the cluster-autoscaler support, on the Node (the budgets'
// charges and refusals are budget.ReasonDisruptionClaimed and Denied).
const (
	// ReasonScaleDownDisabled: a budget of the node allows no disruption now,
	// so nodeguard set cluster-autoscaler's scale-down-disabled annotation.
	ReasonScaleDownDisabled = "ScaleDownDisabled"
	// ReasonScaleDownEnabled: every budget allows again; the annotation went.
	ReasonScaleDownEnabled = "ScaleDownEnabled"

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

	actionHold      = "HoldScaleDown"
	actionScaleDown = "GuardScaleDown"
)
