package budget

// Event reasons of the status controller, on the NodeDisruptionBudget.
const (
	// ReasonClaimUnconfirmed (Warning): a disruption claim was given back
	// because its node showed no deletion within the unconfirmed-claim timeout.
	ReasonClaimUnconfirmed = "DisruptionClaimUnconfirmed"
	actionGiveBack         = "GiveBackClaim"
)
