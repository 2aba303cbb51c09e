package webhook

import (
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// decision is the outcome of a Node or NodeClaim DELETE or of an eviction,
// for the response, events and metrics.
type decision struct {
	allowed bool
	code    int32
	message string
	reason  string
	// claimed are the charges this request made (for events).
	claimed []budget.Charged
	// denier is the budget that denied, if any.
	denier *ngv1alpha1.NodeDisruptionBudget
}

// admit is an admission the door decides by itself, before the rule.
func admit(reason, format string, args ...any) decision {
	return decision{allowed: true, reason: reason, message: fmt.Sprintf(format, args...)}
}

// wording is a door's own words around the rule's verdict, which speaks of
// the node alone.
type wording struct {
	// refusing names what a budget's refusal refuses ("deleting node n1").
	refusing string
	// admitting, when set, goes before the rule's words of an admission
	// within the budgets ("NodeClaim c1 (node n1)").
	admitting string
	// drain is the eviction door's: every admission but a gone instance's
	// has the drain marked charged (reason charged), a node the budgets count
	// unavailable already included.
	drain bool
}

// fromVerdict is the one translation of the rule's verdict into a door's
// decision: the rule's code, reason, charges and refusing budget, in the
// door's words.
func fromVerdict(v budget.Verdict, w wording) decision {
	d := decision{allowed: v.Allowed, code: v.Code, reason: v.Why, message: v.Message, claimed: v.Charged, denier: v.Denier}
	switch {
	case v.Why == budget.WhyBudget:
		d.message = w.refusing + ": " + v.Message
	case w.drain && v.Allowed && v.Why != budget.WhyInstanceGone:
		d.reason = reasonCharged
		d.message = w.admitting + " " + v.Message
	case w.admitting != "" && v.Allowed && v.Why == "":
		d.message = w.admitting + " " + v.Message
	}
	return d
}

// response is the admission response of a decision.
func (d decision) response() admission.Response {
	if d.allowed {
		return admission.Allowed(d.message)
	}
	return denied(d.code, d.message)
}

// denied is a refusal with an HTTP status code kubectl shows: 429 for "not
// now", 403 for "not allowed".
func denied(code int32, msg string) admission.Response {
	reason := metav1.StatusReasonForbidden
	if code == http.StatusTooManyRequests {
		reason = metav1.StatusReasonTooManyRequests
	}
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg},
	}}
}
