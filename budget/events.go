package budget

import ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"

// Event reasons on the NodeDisruptionBudget: every door records the rule's
// charges and refusals with the first two.
const (
	// ReasonDisruptionClaimed: the budget was charged with a node's
	// disruption (a deletion, a NodeClaim deletion, a scale-down).
	ReasonDisruptionClaimed = "DisruptionClaimed"
	// ReasonDisruptionDenied (Warning): the budget refused one.
	ReasonDisruptionDenied = "DisruptionDenied"

	// ReasonClaimUnconfirmed (Warning): a disruption claim was given back
	// because its node showed no deletion within the unconfirmed-claim timeout.
	ReasonClaimUnconfirmed = "DisruptionClaimUnconfirmed"
	actionGiveBack         = "GiveBackClaim"

	// The reasons below are recorded once each, when the DisruptionAllowed
	// condition turns to them.

	// ReasonInvalidSelector (Warning): the selector cannot be evaluated (a
	// budget stored before the CRD refused such selectors), so the budget
	// selects no node and guards none.
	ReasonInvalidSelector = ngv1alpha1.ReasonInvalidSelector
	// ReasonNoMatchingNodes (Warning): the selector matches no node, so the
	// budget guards none (a typo in a label, or a pool scaled to zero).
	ReasonNoMatchingNodes = ngv1alpha1.ReasonNoMatchingNodes
	// ReasonInvalidSpec (Warning): the spec cannot be evaluated (a window
	// schedule stored before the budget webhook checked it), so every delete
	// under the budget is refused.
	ReasonInvalidSpec = ngv1alpha1.ReasonInvalidSpec
	actionEvaluate    = "EvaluateBudget"
)
