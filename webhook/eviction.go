package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"golang.org/x/sync/singleflight"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/internal/autoscaler"
)

// EvictionPath serves the validating webhook for pods/eviction.
const EvictionPath = "/validate-pod-eviction"

// EvictionWebhookName is the eviction webhook's name in its configuration.
const EvictionWebhookName = "pod-eviction.nodeguard.io"

// DefaultEvictionTimeout is the time budget of one eviction decision, below
// the webhook's 5 s timeout so that nodeguard answers "retry" itself.
const DefaultEvictionTimeout = 4 * time.Second

// Every drainer (kubectl drain, an AKS upgrade, cluster-autoscaler, a reboot
// daemon) evicts through pods/eviction, so the eviction is where nodeguard
// sees drains it did not start. failurePolicy Ignore: while nodeguard is down,
// evictions go on unguarded rather than every eviction in the cluster
// failing; nodeguard picks such drains up when it is back (finalizer/follow.go).
// +kubebuilder:webhook:path=/validate-pod-eviction,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods/eviction,verbs=create,versions=v1,name=pod-eviction.nodeguard.io,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// EvictionHandler counts someone else's drain against the node's budgets.
// An eviction from a schedulable node is admitted at once (a cache lookup of
// the pod and the node, and one read of the node from the API server). The first
// eviction from a cordoned node (or one whose DrainInProgress condition says
// it drains) charges the node's NodeDisruptionBudgets by the one rule
// (budget.Rule) and marks the node (ngv1alpha1.DrainChargedAtAnnotation),
// which counts it unavailable and cuts its traffic until it is schedulable
// and Ready again. No room: 429 naming the budget, which every drainer
// retries. A node cluster-autoscaler scales down is charged by the
// scale-down hold (internal/autoscaler): its evictions wait (429) for that
// claim. With Azure, evictions from a charged node wait (429) until its
// traffic cut is confirmed or timed out. The steps are decided here; the
// charge and the mark are evictioncharge.go's, the waits evictionwait.go's.
type EvictionHandler struct {
	// Off admits every eviction (--outside-drains=false).
	Off  bool
	Pods *PodNodes
	// Nodes reads nodes (the manager's cache); Reader reads a node the cache
	// shows schedulable again from the API server.
	Nodes  client.Reader
	Reader client.Reader
	// Client writes the drain mark.
	Client client.Client
	// Rule is the drain rule (budget.Rules.Drain): it reads no Lease.
	Rule    *budget.Rule
	Managed labels.Selector
	Signals *ngv1alpha1.Signals
	Traffic TrafficGate
	// Self is nodeguard's own username (a SelfSubjectReview at start-up):
	// its own drains evict only after their traffic cut, so their evictions
	// are never held for it. "" holds them like any other.
	Self     string
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	Timeout  time.Duration

	// first makes the concurrent evictions of one node (kubectl drain sends
	// them all at once) share one charge; recent keeps the marks written
	// until the node cache shows them (node UID to marked node); asked, when
	// this replica last renewed an unconfirmed drain (node UID to time).
	first  singleflight.Group
	recent sync.Map
	asked  sync.Map
}

// eviction is the part of a policy/v1 (or v1beta1) Eviction the decision reads.
type eviction struct {
	DeleteOptions *struct {
		DryRun []string `json:"dryRun,omitempty"`
	} `json:"deleteOptions,omitempty"`
}

// Reasons of eviction decisions (metric label values) beyond the rule's.
const (
	reasonSchedulable = "schedulable"
	// reasonUnconfirmed: schedulable in the cache, the fresh read failed.
	reasonUnconfirmed = "schedulable_unconfirmed"
	reasonNoNode      = "no_node"
	reasonUnmanaged   = "unmanaged"
	reasonDisrupted   = "disrupted"
	reasonCharged     = "charged"
	reasonTrafficCut  = "traffic_cut"
	// reasonScaleDownUnclaimed: a cluster-autoscaler scale-down whose budget
	// claim nodeguard has not made yet.
	reasonScaleDownUnclaimed = "scale_down_unclaimed"
	reasonOff                = "off"
)

// Handle implements admission.Handler.
func (h *EvictionHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	if req.Operation != admissionv1.Create || req.SubResource != "eviction" {
		// Never block an eviction for a review nodeguard did not expect.
		observeEviction(resultAllowed, reasonInvalidRequest, start)
		return admission.Allowed(fmt.Sprintf("not an eviction (%s %s/%s); nothing to decide", req.Operation, req.Resource.Resource, req.SubResource))
	}
	if h.Off {
		observeEviction(resultAllowed, reasonOff, start)
		return admission.Allowed("nodeguard does not guard outside drains (--outside-drains=false)")
	}
	ctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	d, err := h.decide(ctx, req, evictionDryRun(req))
	if err != nil {
		observeEviction(resultError, reasonInternal, start)
		logf.FromContext(ctx).Error(err, "Deciding an eviction", "pod", req.Namespace+"/"+req.Name)
		return denied(http.StatusTooManyRequests, fmt.Sprintf("nodeguard could not decide the eviction of pod %s/%s (%v); retry", req.Namespace, req.Name, err))
	}
	if d.allowed {
		observeEviction(resultAllowed, d.reason, start)
	} else {
		observeEviction(resultDenied, d.reason, start)
	}
	return d.response()
}

// evictionDryRun reports a dry run, asked either of the request or in the
// Eviction's deleteOptions (kubectl drain --dry-run=server).
func evictionDryRun(req admission.Request) bool {
	if req.DryRun != nil && *req.DryRun {
		return true
	}
	var e eviction
	if json.Unmarshal(req.Object.Raw, &e) != nil || e.DeleteOptions == nil {
		return false
	}
	return slices.Contains(e.DeleteOptions.DryRun, metav1.DryRunAll)
}

// decide runs the steps in order; the first that decides wins.
func (h *EvictionHandler) decide(ctx context.Context, req admission.Request, dryRun bool) (decision, error) {
	pod := req.Namespace + "/" + req.Name
	d, node, err := h.podNode(ctx, req)
	if node == nil || err != nil {
		return d, err
	}
	if d, wait, err := h.deletingCutWait(ctx, node, req); wait || err != nil {
		return d, err
	}
	if d, node, err = h.drainingNode(ctx, node, pod); node == nil || err != nil {
		return d, err
	}
	if node.DeletionTimestamp == nil && autoscaler.ScaleDownHeld(node, h.Signals) {
		return h.scaleDownWait(node, pod), nil
	}
	if why := disruptedBy(node, h.Signals); why != "" {
		return admit(reasonDisrupted, "node %s is already being disrupted (%s): its evictions charge nothing more", node.Name, why), nil
	}
	return h.chargedDrain(ctx, node, pod, req.UserInfo.Username, dryRun)
}

// podNode reads the evicted pod's node from the cache; no node when d
// decides already: the pod or its node does not exist, or nodeguard does not
// manage the node.
func (h *EvictionHandler) podNode(ctx context.Context, req admission.Request) (decision, *corev1.Node, error) {
	nodeName, err := h.Pods.NodeOf(ctx, req.Namespace, req.Name)
	if err != nil {
		return decision{}, nil, err
	}
	if nodeName == "" {
		return admit(reasonNoNode, "pod %s/%s does not exist or runs on no node", req.Namespace, req.Name), nil, nil
	}
	var node corev1.Node
	if err := h.Nodes.Get(ctx, client.ObjectKey{Name: nodeName}, &node); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return admit(reasonNoNode, "node %s of pod %s/%s does not exist", nodeName, req.Namespace, req.Name), nil, nil
		}
		return decision{}, nil, fmt.Errorf("reading node %s: %w", nodeName, err)
	}
	if !h.Managed.Matches(labels.Set(node.Labels)) {
		return admit(reasonUnmanaged, "node %s is not managed by nodeguard", node.Name), nil, nil
	}
	return decision{}, &node, nil
}

// drainingNode returns the node a drain is seen on: the cached one when it
// shows the drain, else the node read fresh. A drainer cordons (or
// cluster-autoscaler taints), then evicts at once, and a scale-down's claim
// is the leader's write: the cache may not show either yet, and only a read
// from the API server can. No node when d decides already: the node is
// schedulable.
func (h *EvictionHandler) drainingNode(ctx context.Context, cached *corev1.Node, pod string) (decision, *corev1.Node, error) {
	scaleDownHeld := autoscaler.ScaleDownHeld(cached, h.Signals)
	if ngv1alpha1.DrainShown(cached) && !scaleDownHeld {
		return decision{}, cached, nil
	}
	var fresh corev1.Node
	if err := h.Reader.Get(ctx, client.ObjectKey{Name: cached.Name}, &fresh); err != nil {
		if ngv1alpha1.DrainShown(cached) || scaleDownHeld {
			return decision{}, nil, fmt.Errorf("reading node %s: %w", cached.Name, err)
		}
		// Refusing here would stop evictions cluster-wide whenever the API
		// server is slow to nodeguard (throttled, timed out): the cache says
		// schedulable, so admit, as failurePolicy Ignore does when nodeguard
		// is unreachable.
		logf.FromContext(ctx).Info("Admitting an eviction from a node the cache shows schedulable; its fresh read failed",
			"pod", pod, "node", cached.Name, "error", err.Error())
		return admit(reasonUnconfirmed, "node %s is schedulable in nodeguard's cache (its fresh read failed: %v)", cached.Name, err), nil, nil
	}
	if !ngv1alpha1.DrainShown(&fresh) && !autoscaler.ScaleDownHeld(&fresh, h.Signals) {
		return admit(reasonSchedulable, "node %s is schedulable", fresh.Name), nil, nil
	}
	return decision{}, &fresh, nil
}

// chargedDrain charges a drain at its first eviction and marks the node,
// or, at a later one, renews the ask of a charge not yet confirmed; either
// waits for the node's traffic cut.
func (h *EvictionHandler) chargedDrain(ctx context.Context, node *corev1.Node, pod, user string, dryRun bool) (decision, error) {
	h.withRecentMark(node)
	if _, charged := ngv1alpha1.DrainCharged(node); !charged {
		d, marked, err := h.chargeFirst(ctx, node, pod, user, dryRun)
		if err != nil || !d.allowed || marked == nil || dryRun {
			return d, err
		}
		node = marked
	} else if !dryRun {
		h.noteAsked(ctx, node)
	}
	return h.awaitTrafficCut(node, pod), nil
}

// disruptedBy names the disruption the node is already under, whose door
// charged its budgets (or that no budget holds back): nodeguard terminates
// it, its NodeClaim's or its scale-down's deletion was charged, or it carries
// a signal taint (an out-of-service, shutdown or spot eviction cannot wait).
// "" when none.
func disruptedBy(node *corev1.Node, signals *ngv1alpha1.Signals) string {
	if by := ngv1alpha1.ChargedElsewhere(node); by != "" {
		return by
	}
	for _, t := range node.Spec.Taints {
		if s, ok := signals.Of(t); ok && !signals.AwaitsDisruptionClaim(node, t) {
			return "taint " + s.String()
		}
	}
	return ""
}
