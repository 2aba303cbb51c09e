package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/karpenter"
)

// DeletePath serves the validating webhook for Node DELETE.
const DeletePath = "/validate-node-delete"

// DefaultDeleteTimeout is the time budget of one DELETE decision, below the
// webhook's 5 s timeout so that nodeguard answers "retry" itself.
const DefaultDeleteTimeout = 4 * time.Second

// The DELETE webhook is not called for a node already being deleted (a DELETE
// has no object: the condition reads oldObject): such a delete changes nothing
// and is allowed anyway, so it must not fail while nodeguard is down.
// +kubebuilder:webhook:path=/validate-node-delete,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups="",resources=nodes,verbs=delete,versions=v1,name=delete.nodeguard.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"not-deleting","expression":"!has(oldObject.metadata.deletionTimestamp)"}]}`
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch,namespace=kube-node-maintenance
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=nodeguard.io,resources=nodedisruptionbudgets/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// DeleteHandler admits a node deletion only when nobody else holds the node's
// maintenance Lease and every NodeDisruptionBudget selecting the node allows one
// more disruption, which it charges to each of them.
type DeleteHandler struct {
	// Client patches nodes.
	Client client.Client
	// Reader reads a Karpenter node's NodeClaim fresh from the API server.
	Reader client.Reader
	// Rule decides the deletion: the deletion doors' rule (budget.Rules),
	// which reads maintenance Leases.
	Rule     *budget.Rule
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Timeout  time.Duration
	// Warnings, when set, tells an admitted delete what its drain will meet.
	Warnings *Warnings
}

// Handle implements admission.Handler.
func (h *DeleteHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	if req.Operation != admissionv1.Delete {
		observe(req.Operation, resultError, reasonInvalidRequest, start)
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("unexpected operation %q: this webhook admits Node DELETE only", req.Operation))
	}
	node, err := decodeNode(req.OldObject, "oldObject")
	if err != nil {
		observe(req.Operation, resultError, reasonInvalidRequest, start)
		return admission.Errored(http.StatusBadRequest, err)
	}
	ctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	dryRun := req.DryRun != nil && *req.DryRun
	var foreseen *foreseeing
	if node.DeletionTimestamp == nil && h.Managed.Matches(labels.Set(node.Labels)) {
		foreseen = h.Warnings.start(ctx, node) // while the budgets are charged
	}
	d, err := h.decide(ctx, node, dryRun)
	if err != nil {
		foreseen.drop()
		observe(req.Operation, resultError, reasonInternal, start)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !dryRun {
		h.record(node, d)
	}
	if d.allowed {
		observe(req.Operation, resultAllowed, d.reason, start)
		if d.reason == reasonKarpenter { // Karpenter drains it, not nodeguard
			foreseen.drop()
			return d.response()
		}
		return d.response().WithWarnings(foreseen.collect(ctx, h.Warnings.wait())...)
	}
	foreseen.drop()
	observe(req.Operation, resultDenied, d.reason, start)
	return d.response()
}

// decide runs the DELETE steps in order; the first that decides wins.
func (h *DeleteHandler) decide(ctx context.Context, node *corev1.Node, dryRun bool) (decision, error) {
	if node.DeletionTimestamp != nil {
		return decision{allowed: true, message: "node is already being deleted"}, nil
	}
	if !h.Managed.Matches(labels.Set(node.Labels)) {
		return decision{allowed: true, message: "node is not managed by nodeguard"}, nil
	}
	how, err := karpenter.Terminates(ctx, h.Reader, h.Managed, node)
	if err != nil {
		return decision{}, err
	}
	if how != "" {
		return decision{allowed: true, reason: reasonKarpenter, message: fmt.Sprintf(
			"node %s is terminated by Karpenter: %s; nodeguard cuts its traffic and Karpenter drains it", node.Name, how)}, nil
	}
	missing := !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) && !dryRun
	addedAt, justAdded := finalizerJustAdded(node, h.Clock.Now())
	if !missing && !justAdded {
		return h.judge(ctx, node, dryRun)
	}
	// A node without the finalizer is guarded from its next delete on; the
	// rule's checks before the budgets still decide this one.
	v, decided, err := h.Rule.DecideBeforeBudgets(ctx, node)
	if err != nil {
		return decision{}, err
	}
	if decided {
		return fromVerdict(v, h.wording(node)), nil
	}
	if missing {
		return h.addFinalizer(ctx, node)
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonFinalizerAdded, message: fmt.Sprintf(
		"nodeguard added its finalizer to node %s at %s, while a delete may have been in flight: retry the delete in a few seconds",
		node.Name, addedAt.UTC().Format(time.RFC3339))}, nil
}

// judge applies the disruption rule to a guarded node's delete.
func (h *DeleteHandler) judge(ctx context.Context, node *corev1.Node, dryRun bool) (decision, error) {
	v, err := h.Rule.Decide(ctx, node, dryRun)
	if err != nil {
		return decision{}, err
	}
	return fromVerdict(v, h.wording(node)), nil
}

// wording is the Node DELETE's words around the rule's verdict.
func (h *DeleteHandler) wording(node *corev1.Node) wording {
	return wording{refusing: "deleting node " + node.Name}
}

// addFinalizer puts the finalizer (and the time it was added) on a node that
// lacks it, and denies this delete. The API server decided to delete at once
// from the object it read before admission; seeing the node changed, it runs
// admission again within the same request, and finalizerJustAdded denies that
// too. Only a fresh delete, which sees the finalizer, is guarded.
//
// The patch carries the node's resourceVersion: a merge patch replaces the
// whole finalizer list, so without the lock a finalizer another controller
// added since the API server read the node would be lost. A node changed
// since is told to retry.
func (h *DeleteHandler) addFinalizer(ctx context.Context, node *corev1.Node) (decision, error) {
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	markFinalizerAdded(node, h.Clock.Now())
	if err := h.Client.Patch(ctx, node, patch); err != nil {
		if apierrors.IsConflict(err) {
			return decision{code: http.StatusTooManyRequests, reason: reasonNodeChanged, message: fmt.Sprintf(
				"node %s changed while nodeguard added its %s finalizer: retry the delete", node.Name, ngv1alpha1.TerminationFinalizer)}, nil
		}
		return decision{}, fmt.Errorf("adding finalizer to node %s: %w", node.Name, err)
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonFinalizerAdded, message: fmt.Sprintf(
		"node %s had no %s finalizer; nodeguard added it so that the node is drained before it goes: retry the delete",
		node.Name, ngv1alpha1.TerminationFinalizer)}, nil
}

// record emits the events of a decision on the node and on the budgets.
func (h *DeleteHandler) record(node *corev1.Node, d decision) {
	events := doorEvents{recorder: h.Recorder, action: actionAdmit,
		refusedReason: ReasonDeletionDenied, admittedReason: ReasonDeletionAdmitted}
	switch {
	case d.reason == reasonFinalizerAdded:
		events.onNode(node, ReasonFinalizerAdded, d.message)
	case !d.allowed:
		events.refused(node, d)
	case d.reason == reasonUnavailableNode || d.reason == reasonInstanceGone || d.reason == reasonKarpenter:
		events.admitted(node, nil, nil, "deletion admitted: "+d.message)
	case len(d.claimed) > 0:
		events.admitted(node, d.claimed, func(string) string { return "charged the deletion of node " + node.Name },
			"deletion admitted "+d.message)
	}
}
