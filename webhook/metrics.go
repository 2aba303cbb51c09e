package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/nodeguard/nodeguard/budget"
)

// Metric labels.
const (
	labelOperation = "operation"
	labelResult    = "result"
	labelReason    = "reason"
	labelWebhook   = "webhook"
)

// Admission results and denial reasons (metric label values).
const (
	resultAllowed = "allowed"
	resultPatched = "patched"
	resultDenied  = "denied"
	resultError   = "error"

	reasonNone = ""
	// The rule's reasons (budget.Verdict.Why).
	reasonBudget          = budget.WhyBudget
	reasonMaintenanceHold = budget.WhyMaintenanceHold
	reasonFinalizerAdded  = "finalizer_added"
	// reasonNodeChanged (denied): the node changed while the DELETE handler
	// added its finalizer (an optimistic-lock conflict); the delete is retried.
	reasonNodeChanged    = "node_changed"
	reasonInvalidRequest = "invalid_request"
	reasonInternal       = "internal"
	// reasonUnavailableNode (allowed): a node the budgets count unavailable
	// already, deleted without consuming a disruption.
	reasonUnavailableNode = budget.WhyUnavailableNode
	// reasonInstanceGone (allowed): a NotReady node whose cloud instance is
	// gone (the cloud node lifecycle controller's delete).
	reasonInstanceGone = budget.WhyInstanceGone
	// reasonKarpenter (allowed): a node Karpenter terminates.
	reasonKarpenter = "karpenter"
)

// operationLabel bounds the operation label to the operations the API server
// sends: anyone who can reach the webhook Service can post a review, and an
// operation of their choosing must not become a new time series.
func operationLabel(op admissionv1.Operation) string {
	switch op {
	case admissionv1.Create, admissionv1.Update, admissionv1.Delete, admissionv1.Connect:
		return string(op)
	}
	return "other"
}

var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_admission_requests_total",
		Help: "Node admission decisions by operation (CREATE, UPDATE, DELETE; other for a malformed review), result (allowed, patched, denied, error) and reason (why denied; unavailable_node: an unavailable node's deletion admitted without a disruption; instance_gone: a NotReady node whose cloud instance is gone; karpenter: a node Karpenter terminates).",
	}, []string{labelOperation, labelResult, labelReason})
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "nodeguard_admission_duration_seconds",
		Help:    "Time to decide a Node admission request, including budget claims.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{labelOperation})

	evictionDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_eviction_admission_requests_total",
		Help: "Eviction decisions by result (allowed, denied, error) and reason (schedulable: the common path; no_node, unmanaged; disrupted: a node another door charged; charged: a drain counted against its budgets; budget, traffic_cut, scale_down_unclaimed: refused with 429 until there is room, the cut is confirmed or a cluster-autoscaler scale-down is charged; schedulable_unconfirmed: schedulable in the cache, its fresh read failed; instance_gone, unavailable_node).",
	}, []string{labelResult, labelReason})
	evictionLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "nodeguard_eviction_admission_duration_seconds",
		Help:    "Time to decide an eviction, by result.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{labelResult})

	scopeMismatches = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_webhook_scope_mismatch",
		Help: "1 for each of nodeguard's webhooks whose objectSelector does not select the nodes of --node-selector (checked at start-up).",
	}, []string{labelWebhook})
)

func init() {
	metrics.Registry.MustRegister(decisions, latency, evictionDecisions, evictionLatency, scopeMismatches)
}

func observeEviction(result, reason string, start time.Time) {
	evictionDecisions.WithLabelValues(result, reason).Inc()
	evictionLatency.WithLabelValues(result).Observe(time.Since(start).Seconds())
}
