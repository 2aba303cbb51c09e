package taintwatch

// Event reasons on the Node (an API: keep them stable). The admin-state
// manager adds its own (azure.ReasonDown, azure.ReasonNone,
// azure.ReasonUpdateFailed, azure.ReasonUpdateRetrying) once Azure answers.
const (
	// ReasonSpotEvictionTaintAdded: a PreemptScheduled event became the
	// spot-eviction taint.
	ReasonSpotEvictionTaintAdded = "SpotEvictionTaintAdded"
	// ReasonSpotEvictionNoticeExpired (Warning): the node still ran well past
	// a PreemptScheduled notice, so the notice was false: nodeguard removed
	// the spot-eviction taint it had added (or did not add it).
	ReasonSpotEvictionNoticeExpired = "SpotEvictionNoticeExpired"
	// ReasonAdminStateDownRequested: the node carries a signal, and nodeguard
	// asked for its load-balancer entries to be Down.
	ReasonAdminStateDownRequested = "LoadBalancerAdminStateDownRequested"
	// ReasonAdminStateRestoreRequested: every signal is gone, and nodeguard
	// asked for None on the entries it had set Down.
	ReasonAdminStateRestoreRequested = "LoadBalancerAdminStateRestoreRequested"
	// ReasonAdminStateReleased: Azure confirmed None; nodeguard no longer
	// manages the node's entries.
	ReasonAdminStateReleased = "LoadBalancerAdminStateReleased"

	actionSpotTaint   = "AddSpotEvictionTaint"
	actionSpotUntaint = "RemoveSpotEvictionTaint"
	actionAdminState  = "SetLoadBalancerAdminState"
)
