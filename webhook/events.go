package webhook

// Event reasons of the guard, on the Node and on the NodeDisruptionBudget.
const (
	// ReasonDeletionAdmitted (Node): the deletion was admitted within every budget.
	ReasonDeletionAdmitted = "NodeDeletionAdmitted"
	// ReasonDeletionDenied (Node, Warning): a budget or a maintenance hold denied it.
	ReasonDeletionDenied = "NodeDeletionDenied"
	// ReasonNodeClaimDeletionAdmitted (Node): the deletion of its Karpenter
	// NodeClaim was admitted within every budget, or its instance is gone.
	ReasonNodeClaimDeletionAdmitted = "NodeClaimDeletionAdmitted"
	// ReasonNodeClaimDeletionDenied (Node, Warning): a budget or a
	// maintenance hold denied the deletion of its NodeClaim.
	ReasonNodeClaimDeletionDenied = "NodeClaimDeletionDenied"
	// ReasonFinalizerAdded (Node): the termination finalizer was added during a
	// delete, which is denied once so that the retry is guarded.
	ReasonFinalizerAdded = "TerminationFinalizerAdded"

	// ReasonDrainCharged (Node): someone else's drain of the node (its first
	// eviction from the cordoned node) was counted against its budgets.
	ReasonDrainCharged = "DrainCharged"
	// ReasonDrainDenied (Node, Warning): a budget refused an eviction of that
	// drain (429); the drainer retries.
	ReasonDrainDenied = "DrainDenied"

	// ReasonWebhookScopeMismatch (webhook configuration, Warning): a webhook's
	// objectSelector does not select the nodes of --node-selector.
	ReasonWebhookScopeMismatch = "WebhookScopeMismatch"

	actionAdmit = "AdmitNodeDeletion"
	// actionAdmitEviction: deciding an eviction of someone else's drain.
	actionAdmitEviction = "AdmitEviction"
	actionCheckScope    = "CheckWebhookScope"
)
