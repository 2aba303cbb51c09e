package webhook

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// FinalizerPath serves the mutating webhook for Node CREATE and UPDATE.
const FinalizerPath = "/mutate-node-finalizer"

// The finalizer webhook is called only for nodes that lack the finalizer and
// are not being deleted (matchConditions): not for every heartbeat-free label,
// taint or annotation change of every node.
// +kubebuilder:webhook:path=/mutate-node-finalizer,mutating=true,failurePolicy=ignore,sideEffects=None,groups="",resources=nodes,verbs=create;update,versions=v1,name=finalizer.nodeguard.io,admissionReviewVersions=v1,timeoutSeconds=3,reinvocationPolicy=IfNeeded,patch=`{"matchConditions":[{"name":"lacks-finalizer","expression":"!has(object.metadata.finalizers) || !object.metadata.finalizers.exists(f, f == 'nodeguard.io/termination')"},{"name":"not-deleting","expression":"!has(object.metadata.deletionTimestamp)"}]}`

// The finalizer webhook fails open (Ignore): node registration must never depend
// on nodeguard being up, and the backfill controller adds what it missed.
//
// FinalizerHandler adds the termination finalizer to every managed node that
// lacks it and is not being deleted, with a JSON patch that touches nothing else.
// On an UPDATE it also marks when (FinalizerAddedAtAnnotation): a delete the
// API server decided from the node as it was before this update would
// otherwise be admitted with the finalizer in view and carried out without it.
type FinalizerHandler struct {
	// Managed selects the nodes nodeguard manages.
	Managed labels.Selector
	// Clock stamps the mark; nil is the real clock.
	Clock clock.PassiveClock
}

// Handle implements admission.Handler.
func (h *FinalizerHandler) Handle(_ context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, result, reason := h.decide(req)
	observe(req.Operation, result, reason, start)
	return resp
}

func (h *FinalizerHandler) decide(req admission.Request) (admission.Response, string, string) {
	if req.Operation == "" {
		// Not a review the API server sends (an empty body, JSON that is no
		// AdmissionReview, a review without a request).
		return admission.Errored(http.StatusBadRequest, errors.New("admission review has no request operation")), resultError, reasonInvalidRequest
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed(""), resultAllowed, reasonNone
	}
	node, err := decodeNode(req.Object, "object")
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err), resultError, reasonInvalidRequest
	}
	if node.DeletionTimestamp != nil || !h.Managed.Matches(labels.Set(node.Labels)) ||
		slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		return admission.Allowed(""), resultAllowed, reasonNone
	}
	patches := []jsonpatch.Operation{addFinalizerPatch(node.Finalizers)}
	if req.Operation == admissionv1.Update {
		patches = append(patches, markPatch(node.Annotations, h.now()))
	}
	return admission.Patched("added the "+ngv1alpha1.TerminationFinalizer+" finalizer", patches...), resultPatched, reasonNone
}

func (h *FinalizerHandler) now() time.Time {
	if h.Clock == nil {
		return time.Now()
	}
	return h.Clock.Now()
}

// markPatch records when the finalizer was added (the mark markFinalizerAdded
// writes), creating the annotations if there are none.
func markPatch(existing map[string]string, now time.Time) jsonpatch.Operation {
	at := ngv1alpha1.FormatTime(now)
	if len(existing) == 0 {
		return jsonpatch.Operation{Operation: "add", Path: "/metadata/annotations",
			Value: map[string]string{ngv1alpha1.FinalizerAddedAtAnnotation: at}}
	}
	// A JSON pointer writes "/" in a key as "~1".
	key := strings.ReplaceAll(ngv1alpha1.FinalizerAddedAtAnnotation, "/", "~1")
	return jsonpatch.Operation{Operation: "add", Path: "/metadata/annotations/" + key, Value: at}
}

// addFinalizerPatch appends the finalizer, creating the list if there is none.
func addFinalizerPatch(existing []string) jsonpatch.Operation {
	if len(existing) == 0 {
		return jsonpatch.Operation{Operation: "add", Path: "/metadata/finalizers", Value: []string{ngv1alpha1.TerminationFinalizer}}
	}
	return jsonpatch.Operation{Operation: "add", Path: "/metadata/finalizers/-", Value: ngv1alpha1.TerminationFinalizer}
}

func observe(op admissionv1.Operation, result, reason string, start time.Time) {
	decisions.WithLabelValues(operationLabel(op), result, reason).Inc()
	latency.WithLabelValues(operationLabel(op)).Observe(time.Since(start).Seconds())
}
