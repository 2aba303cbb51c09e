package webhook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/karpenter"
)

// NodeClaimDeletePath serves the validating webhook for Karpenter's NodeClaim
// DELETE.
const NodeClaimDeletePath = "/validate-nodeclaim-delete"

// NodeClaimWebhookName is the NodeClaim webhook's name in its configuration.
const NodeClaimWebhookName = "nodeclaim.nodeguard.io"

// Karpenter (and AKS node auto-provisioning) disrupts a node by deleting its
// NodeClaim; the Node's deletion follows from the NodeClaim's finalizer and is
// admitted while that NodeClaim is deleting (karpenter.Terminates). The
// NodeClaim DELETE is therefore where the budgets apply. The webhook is called
// only for NodeClaims that have a node and are not deleting yet (a NodeClaim
// that never registered is Karpenter's to clean up, nodeguard or not), and,
// with the managed-nodes scope, only for NodeClaims labelled like managed
// nodes (its objectSelector; Karpenter copies a NodeClaim's labels onto its
// Node). Installed where the NodeClaim CRD does not exist, the configuration
// matches nothing and costs nothing; the handler reads the NodeClaim only
// from the review (the Node DELETE webhook reads a Karpenter node's NodeClaim
// from the API server, karpenter.Terminates).
// +kubebuilder:webhook:path=/validate-nodeclaim-delete,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=karpenter.sh,resources=nodeclaims,verbs=delete,versions=v1,name=nodeclaim.nodeguard.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"not-deleting","expression":"!has(oldObject.metadata.deletionTimestamp)"},{"name":"has-node","expression":"has(oldObject.status) && has(oldObject.status.nodeName) && oldObject.status.nodeName != ''"}]}`

// nodeClaim is the part of a karpenter.sh/v1 NodeClaim the decision reads.
type nodeClaim struct {
	Metadata struct {
		Name              string  `json:"name"`
		DeletionTimestamp *string `json:"deletionTimestamp,omitempty"`
	} `json:"metadata"`
	Status struct {
		NodeName   string `json:"nodeName,omitempty"`
		ProviderID string `json:"providerID,omitempty"`
	} `json:"status"`
}

// NodeClaimDeleteHandler admits a NodeClaim deletion only when its node may be
// disrupted: the node's instance is already gone, or nobody else holds its
// maintenance Lease and every NodeDisruptionBudget selecting it allows one
// more disruption, which it charges to each of them.
type NodeClaimDeleteHandler struct {
	// Client patches the denial mark onto nodes (nil: no mark).
	Client client.Client
	// Nodes reads nodes (the manager's cache is fine).
	Nodes client.Reader
	// Rule decides the disruption: the deletion doors' rule (budget.Rules),
	// which reads maintenance Leases.
	Rule     *budget.Rule
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Timeout  time.Duration
}

// Handle implements admission.Handler.
func (h *NodeClaimDeleteHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Delete {
		observeNodeClaim(resultError, reasonInvalidRequest)
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("unexpected operation %q: this webhook admits NodeClaim DELETE only", req.Operation))
	}
	claim, err := decodeNodeClaim(req.OldObject)
	if err != nil {
		observeNodeClaim(resultError, reasonInvalidRequest)
		return admission.Errored(http.StatusBadRequest, err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	dryRun := req.DryRun != nil && *req.DryRun
	d, node, err := h.decide(ctx, claim, dryRun)
	if err != nil {
		observeNodeClaim(resultError, reasonInternal)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !dryRun && node != nil {
		h.record(node, claim.Metadata.Name, d)
		h.mark(ctx, node, d)
	}
	if d.allowed {
		observeNodeClaim(resultAllowed, d.reason)
	} else {
		observeNodeClaim(resultDenied, d.reason)
	}
	return d.response()
}

// mark leaves the decision on the node (package karpenter's marks): a
// denial, for the release of a node Karpenter keeps tainted; a charge, the
// disruption under way until Karpenter deletes the Node.
func (h *NodeClaimDeleteHandler) mark(ctx context.Context, node *corev1.Node, d decision) {
	if h.Client == nil {
		return
	}
	if !d.allowed {
		karpenter.MarkDenied(ctx, h.Client, node, d.deniedBy(node), h.Clock.Now())
	}
	if len(d.claimed) > 0 {
		karpenter.MarkCharged(ctx, h.Client, node, h.Clock.Now())
	}
}

// deniedBy names what denied a NodeClaim DELETE, for the denial mark.
func (d decision) deniedBy(node *corev1.Node) string {
	switch {
	case d.denier != nil:
		return fmt.Sprintf("NodeDisruptionBudget %q", d.denier.Name)
	case d.reason == reasonMaintenanceHold:
		return fmt.Sprintf("maintenance Lease %s/%s", ngv1alpha1.MaintenanceLeaseNamespace, node.Name)
	}
	return "nodeguard"
}

func decodeNodeClaim(raw runtime.RawExtension) (*nodeClaim, error) {
	if len(raw.Raw) == 0 {
		return nil, fmt.Errorf("the review has no oldObject")
	}
	var c nodeClaim
	// Case-sensitive, as the API server reads JSON.
	if err := utiljson.Unmarshal(raw.Raw, &c); err != nil {
		return nil, fmt.Errorf("decoding oldObject as a NodeClaim: %w", err)
	}
	return &c, nil
}

// decide runs the steps in order; the first that decides wins. It returns
// the node when there is one (for events).
func (h *NodeClaimDeleteHandler) decide(ctx context.Context, claim *nodeClaim, dryRun bool) (decision, *corev1.Node, error) {
	allow := func(reason, format string, args ...any) (decision, *corev1.Node, error) {
		return decision{allowed: true, reason: reason, message: fmt.Sprintf(format, args...)}, nil, nil
	}
	switch {
	case claim.Metadata.DeletionTimestamp != nil:
		return allow(reasonNone, "NodeClaim %s is already being deleted", claim.Metadata.Name)
	case claim.Status.NodeName == "":
		return allow(reasonNone, "NodeClaim %s has no node", claim.Metadata.Name)
	}
	var node corev1.Node
	if err := h.Nodes.Get(ctx, client.ObjectKey{Name: claim.Status.NodeName}, &node); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return allow(reasonNone, "the node %s of NodeClaim %s no longer exists", claim.Status.NodeName, claim.Metadata.Name)
		}
		return decision{}, nil, fmt.Errorf("reading node %s: %w", claim.Status.NodeName, err)
	}
	d, err := h.decideForNode(ctx, claim, &node, dryRun)
	return d, &node, err
}

func (h *NodeClaimDeleteHandler) decideForNode(ctx context.Context, claim *nodeClaim, node *corev1.Node, dryRun bool) (decision, error) {
	switch {
	case node.DeletionTimestamp != nil:
		return decision{allowed: true, message: fmt.Sprintf("node %s is already being deleted", node.Name)}, nil
	case !h.Managed.Matches(labels.Set(node.Labels)):
		return decision{allowed: true, message: fmt.Sprintf("node %s is not managed by nodeguard", node.Name)}, nil
	}
	v, err := h.Rule.Decide(ctx, node, dryRun)
	if err != nil {
		return decision{}, err
	}
	what := fmt.Sprintf("NodeClaim %s (node %s)", claim.Metadata.Name, node.Name)
	return fromVerdict(v, wording{refusing: "deleting " + what, admitting: what}), nil
}

// record emits the decision's events on the node and the budgets.
func (h *NodeClaimDeleteHandler) record(node *corev1.Node, claim string, d decision) {
	events := doorEvents{recorder: h.Recorder, action: actionAdmit,
		refusedReason: ReasonNodeClaimDeletionDenied, admittedReason: ReasonNodeClaimDeletionAdmitted}
	switch {
	case !d.allowed:
		events.refused(node, d)
	case len(d.claimed) > 0 || d.reason == reasonInstanceGone:
		events.admitted(node, d.claimed, func(string) string {
			return fmt.Sprintf("charged the deletion of NodeClaim %s (node %s)", claim, node.Name)
		}, d.message)
	}
}

var nodeClaimDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nodeguard_nodeclaim_admission_requests_total",
	Help: "Karpenter NodeClaim DELETE decisions by result (allowed, denied, error) and reason (budget, maintenance_hold, instance_gone).",
}, []string{labelResult, labelReason})

func init() { metrics.Registry.MustRegister(nodeClaimDecisions) }

func observeNodeClaim(result, reason string) {
	nodeClaimDecisions.WithLabelValues(result, reason).Inc()
}
