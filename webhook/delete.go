package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
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
	// Reader reads maintenance Leases fresh from the API server.
	Reader client.Reader
	// Budgets lists NodeDisruptionBudgets (the manager's cache is fine: each
	// claim is decided by a conditional status write).
	Budgets  client.Reader
	Claimer  *budget.Claimer
	Managed  labels.Selector
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Timeout  time.Duration
	// Instances, when set, says whether a NotReady node's instance is gone.
	Instances InstanceChecker
}

// decision is the outcome of a DELETE, for the response, events and metrics.
type decision struct {
	allowed bool
	code    int32
	message string
	reason  string
	// claimed are the budgets this request newly charged (for events).
	claimed []*ngv1alpha1.NodeDisruptionBudget
	// denier is the budget that denied, if any.
	denier *ngv1alpha1.NodeDisruptionBudget
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
	d, err := h.decide(ctx, node, dryRun)
	if err != nil {
		observe(req.Operation, resultError, reasonInternal, start)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if !dryRun {
		h.record(node, d)
	}
	if d.allowed {
		observe(req.Operation, resultAllowed, d.reason, start)
		return admission.Allowed(d.message)
	}
	observe(req.Operation, resultDenied, d.reason, start)
	return denied(d.code, d.message)
}

// decide runs the DELETE steps in order; the first that decides wins.
func (h *DeleteHandler) decide(ctx context.Context, node *corev1.Node, dryRun bool) (decision, error) {
	if node.DeletionTimestamp != nil {
		return decision{allowed: true, message: "node is already being deleted"}, nil
	}
	if !h.Managed.Matches(labels.Set(node.Labels)) {
		return decision{allowed: true, message: "node is not managed by nodeguard"}, nil
	}
	how, err := karpenterTerminates(ctx, h.Reader, h.Managed, node)
	if err != nil {
		return decision{}, err
	}
	if how != "" {
		return decision{allowed: true, reason: reasonKarpenter, message: fmt.Sprintf(
			"node %s is terminated by Karpenter: %s; nodeguard cuts its traffic and Karpenter drains it", node.Name, how)}, nil
	}
	if instanceGone(ctx, h.Instances, node) {
		return decision{allowed: true, reason: reasonInstanceGone, message: fmt.Sprintf(
			"node %s is not Ready and its instance %s no longer exists: nothing is left to protect", node.Name, node.Spec.ProviderID)}, nil
	}
	missing := !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) && !dryRun
	addedAt, justAdded := finalizerJustAdded(node, h.Clock.Now())
	if !missing && !justAdded {
		return h.claimUnlessHeld(ctx, node, dryRun)
	}
	if d, done, err := h.checkMaintenanceHold(ctx, node); done || err != nil {
		return d, err
	}
	if missing {
		return h.addFinalizer(ctx, node)
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonFinalizerAdded, message: fmt.Sprintf(
		"nodeguard added its finalizer to node %s at %s, while a delete may have been in flight: retry the delete in a few seconds",
		node.Name, addedAt.UTC().Format(time.RFC3339))}, nil
}

// claimUnlessHeld claims the budgets while it reads the node's maintenance
// Lease, instead of after it: read first, the Lease would add an API round
// trip to every guarded delete. A hold still wins: the claims this request
// charged are given back and the delete is denied with the hold. The overlap
// leaves a charge that lives for one round trip; a concurrent delete meeting
// it is told to retry, never admitted beyond the budget.
func (h *DeleteHandler) claimUnlessHeld(ctx context.Context, node *corev1.Node, dryRun bool) (decision, error) {
	type hold struct {
		d    decision
		held bool
		err  error
	}
	holds := make(chan hold, 1)
	go func() {
		d, held, err := h.checkMaintenanceHold(ctx, node)
		holds <- hold{d, held, err}
	}()
	d, err := h.claimBudgets(ctx, node, dryRun)
	if found := <-holds; found.held || found.err != nil {
		if err == nil {
			h.release(ctx, node.Name, d.claimed)
		}
		return found.d, found.err
	}
	return d, err
}

// checkMaintenanceHold denies while someone other than nodeguard holds the
// node's maintenance Lease.
func (h *DeleteHandler) checkMaintenanceHold(ctx context.Context, node *corev1.Node) (decision, bool, error) {
	var lease coordinationv1.Lease
	err := h.Reader.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	if client.IgnoreNotFound(err) != nil {
		return decision{}, false, fmt.Errorf("reading maintenance Lease of node %s: %w", node.Name, err)
	}
	if err != nil {
		return decision{}, false, nil // no Lease: no hold
	}
	hold := budget.HeldAt(&lease, h.Clock.Now())
	if hold == nil || budget.IsNodeguardHolder(hold.Holder) {
		return decision{}, false, nil
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonMaintenanceHold, message: fmt.Sprintf(
		"node %s is under maintenance: its Lease %s/%s is %s; retry after the holder releases it",
		node.Name, ngv1alpha1.MaintenanceLeaseNamespace, node.Name, hold)}, true, nil
}

// addFinalizer puts the finalizer (and the time it was added) on a node that
// lacks it, and denies this delete. The API server decided to delete at once
// from the object it read before admission; seeing the node changed, it runs
// admission again within the same request, and finalizerJustAdded denies that
// too. Only a fresh delete, which sees the finalizer, is guarded.
func (h *DeleteHandler) addFinalizer(ctx context.Context, node *corev1.Node) (decision, error) {
	patch := client.MergeFrom(node.DeepCopy())
	markFinalizerAdded(node, h.Clock.Now())
	if err := h.Client.Patch(ctx, node, patch); err != nil {
		return decision{}, fmt.Errorf("adding finalizer to node %s: %w", node.Name, err)
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonFinalizerAdded, message: fmt.Sprintf(
		"node %s had no %s finalizer; nodeguard added it so that the node is drained before it goes: retry the delete",
		node.Name, ngv1alpha1.TerminationFinalizer)}, nil
}

// claimBudgets charges one disruption to every budget selecting the node, in
// name order; when one denies, it gives back what it charged before.
func (h *DeleteHandler) claimBudgets(ctx context.Context, node *corev1.Node, dryRun bool) (decision, error) {
	budgets, err := h.matchingBudgets(ctx, labels.Set(node.Labels))
	if err != nil {
		return decision{}, err
	}
	var claimed []*ngv1alpha1.NodeDisruptionBudget
	names := make([]string, 0, len(budgets))
	for _, b := range budgets {
		names = append(names, b.Name)
		newly, err := h.Claimer.Claim(ctx, b.Name, node, dryRun)
		if err != nil {
			h.release(ctx, node.Name, claimed)
			var denial *budget.Denial
			if errors.As(err, &denial) {
				return decision{code: denial.Code, reason: reasonBudget, denier: b,
					message: fmt.Sprintf("deleting node %s: %s", node.Name, denial.Message)}, nil
			}
			return decision{}, err
		}
		if newly {
			claimed = append(claimed, b)
		}
	}
	msg := fmt.Sprintf("within %d NodeDisruptionBudget(s)", len(names))
	if len(names) > 0 {
		msg += ": " + strings.Join(names, ", ")
	}
	d := decision{allowed: true, message: msg, claimed: claimed}
	if unavailable, why := budget.Unavailable(node); unavailable && len(names) > 0 {
		// The claims charged nothing: the budgets count this node unavailable
		// already (their unhealthyNodeDeletionPolicy let it go).
		d.reason = reasonUnavailableNode
		d.message = fmt.Sprintf("node %s is already unavailable (%s): its deletion consumes no disruption of %s",
			node.Name, why, strings.Join(names, ", "))
	}
	return d, nil
}

// matchingBudgets returns the budgets selecting the node, sorted by name.
func (h *DeleteHandler) matchingBudgets(ctx context.Context, nodeLabels labels.Set) ([]*ngv1alpha1.NodeDisruptionBudget, error) {
	var list ngv1alpha1.NodeDisruptionBudgetList
	if err := h.Budgets.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NodeDisruptionBudgets: %w", err)
	}
	var matching []*ngv1alpha1.NodeDisruptionBudget
	for i := range list.Items {
		sel, err := budget.Selector(&list.Items[i])
		if err != nil || !sel.Matches(nodeLabels) {
			continue // an invalid selector selects nothing, as for PodDisruptionBudgets
		}
		matching = append(matching, &list.Items[i])
	}
	sort.Slice(matching, func(i, j int) bool { return matching[i].Name < matching[j].Name })
	return matching, nil
}

func (h *DeleteHandler) release(ctx context.Context, node string, claimed []*ngv1alpha1.NodeDisruptionBudget) {
	for _, b := range claimed {
		if err := h.Claimer.Release(ctx, b.Name, node); err != nil {
			// The status controller gives the claim back after the claim timeout.
			logf.FromContext(ctx).Error(err, "Releasing a disruption claim", "node", node, "ndb", b.Name)
		}
	}
}

// record emits the events of a decision on the node and on the budgets.
func (h *DeleteHandler) record(node *corev1.Node, d decision) {
	if h.Recorder == nil {
		return
	}
	switch {
	case d.reason == reasonFinalizerAdded:
		h.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonFinalizerAdded, actionAdmit, "%s", d.message)
	case !d.allowed:
		if d.denier != nil {
			h.Recorder.Eventf(d.denier, node, corev1.EventTypeWarning, ReasonDisruptionDenied, actionAdmit, "%s", d.message)
		}
		h.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonDeletionDenied, actionAdmit, "%s", d.message)
	case d.reason == reasonUnavailableNode || d.reason == reasonInstanceGone || d.reason == reasonKarpenter:
		h.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonDeletionAdmitted, actionAdmit, "deletion admitted: %s", d.message)
	case len(d.claimed) > 0:
		for _, b := range d.claimed {
			h.Recorder.Eventf(b, node, corev1.EventTypeNormal, ReasonDisruptionClaimed, actionAdmit, "charged the deletion of node %s", node.Name)
		}
		h.Recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonDeletionAdmitted, actionAdmit, "deletion admitted %s", d.message)
	}
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
