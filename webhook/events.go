package webhook

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/nodeguard/nodeguard/budget"
)

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

// doorEvents is the one event emitter of the doors (the Node DELETE, the
// NodeClaim DELETE, the first eviction of someone else's drain): a refusal
// on the refusing budget and the node, an admission on each budget charged
// and the node. Each door chooses which of its decisions it records.
type doorEvents struct {
	recorder events.EventRecorder // nil: no events
	action   string
	// refusedReason and admittedReason are the node's events' reasons.
	refusedReason, admittedReason string
}

// refused records a refusal: a Warning on the budget that refused, if one
// did, and on the node.
func (e doorEvents) refused(node *corev1.Node, d decision) {
	if e.recorder == nil {
		return
	}
	if d.denier != nil {
		e.recorder.Eventf(d.denier, node, corev1.EventTypeWarning, budget.ReasonDisruptionDenied, e.action, "%s", d.message)
	}
	e.recorder.Eventf(node, nil, corev1.EventTypeWarning, e.refusedReason, e.action, "%s", d.message)
}

// admitted records an admission: an event on each budget charged (chargeNote
// words it for the budget named), then the node's.
func (e doorEvents) admitted(node *corev1.Node, charged []budget.Charged, chargeNote func(budget string) string, nodeNote string) {
	if e.recorder == nil {
		return
	}
	for _, c := range charged {
		e.recorder.Eventf(c.Budget, node, corev1.EventTypeNormal, budget.ReasonDisruptionClaimed, e.action, "%s", chargeNote(c.Budget.Name))
	}
	e.recorder.Eventf(node, nil, corev1.EventTypeNormal, e.admittedReason, e.action, "%s", nodeNote)
}

// onNode records one more event of the door on the node.
func (e doorEvents) onNode(node *corev1.Node, reason, note string) {
	if e.recorder != nil {
		e.recorder.Eventf(node, nil, corev1.EventTypeNormal, reason, e.action, "%s", note)
	}
}
