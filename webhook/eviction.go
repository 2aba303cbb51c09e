package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"golang.org/x/sync/singleflight"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
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
// traffic cut is confirmed or timed out.
type EvictionHandler struct {
	// Off admits every eviction (--outside-drains=false).
	Off  bool
	Pods *PodNodes
	// Nodes reads nodes (the manager's cache); Reader reads a node the cache
	// shows schedulable again from the API server.
	Nodes  client.Reader
	Reader client.Reader
	// Client writes the drain mark.
	Client  client.Client
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

// recentMarkLifetime bounds how long a written mark stands in for the cache.
const recentMarkLifetime = 30 * time.Second

// TrafficGate is how evictions from a charged node wait for its traffic cut.
type TrafficGate struct {
	// Enabled when Azure is configured: nodeguard cuts the node's traffic.
	Enabled bool
	// Timeout (--admin-state-timeout) bounds the wait from the charge.
	Timeout time.Duration
	// Wait (--traffic-cut-failure=wait) waits past Timeout until the cut is
	// recorded.
	Wait bool
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
	allow := func(reason, format string, args ...any) (decision, error) {
		return decision{allowed: true, reason: reason, message: fmt.Sprintf(format, args...)}, nil
	}
	nodeName, err := h.Pods.NodeOf(ctx, req.Namespace, req.Name)
	if err != nil {
		return decision{}, err
	}
	if nodeName == "" {
		return allow(reasonNoNode, "pod %s/%s does not exist or runs on no node", req.Namespace, req.Name)
	}
	var node corev1.Node
	if err := h.Nodes.Get(ctx, client.ObjectKey{Name: nodeName}, &node); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return allow(reasonNoNode, "node %s of pod %s/%s does not exist", nodeName, req.Namespace, req.Name)
		}
		return decision{}, fmt.Errorf("reading node %s: %w", nodeName, err)
	}
	if !h.Managed.Matches(labels.Set(node.Labels)) {
		return allow(reasonUnmanaged, "node %s is not managed by nodeguard", node.Name)
	}
	if d, wait, err := h.deletingCutWait(ctx, &node, req); wait || err != nil {
		return d, err
	}
	if cached := node; !ngv1alpha1.DrainShown(&cached) || h.scaleDownHeld(&cached) {
		// A drainer cordons (or cluster-autoscaler taints), then evicts at
		// once, and a scale-down's claim is the leader's write: the cache
		// may not show either yet, and only a read from the API server can.
		var fresh corev1.Node
		if err := h.Reader.Get(ctx, client.ObjectKey{Name: nodeName}, &fresh); err != nil {
			if ngv1alpha1.DrainShown(&cached) || h.scaleDownHeld(&cached) {
				return decision{}, fmt.Errorf("reading node %s: %w", nodeName, err)
			}
			// Refusing here would stop evictions cluster-wide whenever the
			// API server is slow to nodeguard (throttled, timed out): the
			// cache says schedulable, so admit, as failurePolicy Ignore does
			// when nodeguard is unreachable.
			logf.FromContext(ctx).Info("Admitting an eviction from a node the cache shows schedulable; its fresh read failed",
				"pod", req.Namespace+"/"+req.Name, "node", nodeName, "error", err.Error())
			return allow(reasonUnconfirmed, "node %s is schedulable in nodeguard's cache (its fresh read failed: %v)", nodeName, err)
		}
		node = fresh
		if !ngv1alpha1.DrainShown(&node) && !h.scaleDownHeld(&node) {
			return allow(reasonSchedulable, "node %s is schedulable", node.Name)
		}
	}
	if node.DeletionTimestamp == nil && h.scaleDownHeld(&node) {
		return h.scaleDownWait(&node, req.Namespace+"/"+req.Name), nil
	}
	pod := req.Namespace + "/" + req.Name
	if why := disruptedBy(&node, h.Signals); why != "" {
		return allow(reasonDisrupted, "node %s is already being disrupted (%s): its evictions charge nothing more", node.Name, why)
	}
	h.withRecentMark(&node)
	if _, charged := ngv1alpha1.DrainCharged(&node); !charged {
		d, marked, err := h.chargeFirst(ctx, &node, pod, req.UserInfo.Username, dryRun)
		if err != nil || !d.allowed || marked == nil || dryRun {
			return d, err
		}
		node = *marked
	} else if !dryRun {
		h.noteAsked(ctx, &node)
	}
	return h.awaitTrafficCut(&node, pod), nil
}

// askedRefresh is how often the evictions of an unconfirmed drain renew
// DrainAskedAtAnnotation: well inside --unconfirmed-claim-timeout (15 s), and
// no more often than kubectl drain retries (every 5 s).
const askedRefresh = 5 * time.Second

// noteAsked records that the drain of a charged node whose charge is not yet
// confirmed is still asking (its drainer retries behind a 429 of nodeguard's
// or of a PodDisruptionBudget's), so that the termination controller does not
// take it for a forged review and withdraw the charge. Best effort: a failed
// write is logged, and the drainer's next retry writes again.
func (h *EvictionHandler) noteAsked(ctx context.Context, node *corev1.Node) {
	if !ngv1alpha1.DrainUnconfirmed(node) {
		h.asked.Delete(node.UID) // confirmed: no renewal is written again
		return
	}
	now := h.Clock.Now()
	last, ok := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainAskedAtAnnotation)
	if !ok {
		last, _ = ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainChargedAtAnnotation)
	}
	if now.Sub(last) < askedRefresh {
		return
	}
	if v, wrote := h.asked.Load(node.UID); wrote && now.Sub(v.(time.Time)) < askedRefresh {
		return // this replica wrote it; the cache has not shown it yet
	}
	h.asked.Store(node.UID, now)
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`,
		ngv1alpha1.DrainAskedAtAnnotation, ngv1alpha1.FormatTime(now)))
	if err := h.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, patch); err != nil {
		logf.FromContext(ctx).Info("Recording that an unconfirmed drain still asks", "node", node.Name, "error", err.Error())
	}
}

// deletingCutWait holds the evictions from a node deleted under nodeguard's
// finalizer until its traffic cut has ended, as nodeguard's own drain waits
// for it: Karpenter (or any drainer of a deleted node) evicts as soon as the
// node is deleted, while nodeguard is still setting its entries Down. The
// cached node may lag the termination controller's TrafficCut condition,
// which comes just before nodeguard's own evictions: a fresh read decides
// before a refusal. Once nodeguard's finalizer is gone the cut is over (or
// was not needed).
func (h *EvictionHandler) deletingCutWait(ctx context.Context, node *corev1.Node, req admission.Request) (decision, bool, error) {
	if !h.Traffic.Enabled || !ngv1alpha1.TerminatingUnderFinalizer(node) || h.cutOver(node) ||
		(h.Self != "" && req.UserInfo.Username == h.Self) {
		return decision{}, false, nil
	}
	var fresh corev1.Node
	if err := h.Reader.Get(ctx, client.ObjectKey{Name: node.Name}, &fresh); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return decision{}, false, nil
		}
		return decision{}, false, fmt.Errorf("reading node %s: %w", node.Name, err)
	}
	if !ngv1alpha1.TerminatingUnderFinalizer(&fresh) || h.cutOver(&fresh) {
		return decision{}, false, nil
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonTrafficCut, message: fmt.Sprintf(
		"evicting pod %s/%s: node %s is being deleted and its load-balancer traffic is being cut (AdminState Down) before its pods go; retry in a few seconds",
		req.Namespace, req.Name, node.Name)}, true, nil
}

// cutOver reports whether a deleted node's traffic cut has ended (the
// TrafficCut condition) or, unless the policy is wait, --admin-state-timeout
// has passed since its deletion.
func (h *EvictionHandler) cutOver(node *corev1.Node) bool {
	if _, ended := ngv1alpha1.TrafficCutEnded(node, h.Traffic.Wait); ended {
		return true
	}
	return !h.Traffic.Wait && !h.Clock.Now().Before(node.DeletionTimestamp.Add(h.Traffic.Timeout))
}

// scaleDownHeld reports whether the node carries cluster-autoscaler's
// scale-down taint and nodeguard's hold (--cluster-autoscaler-scale-down-hold)
// has not let the scale-down go yet: its budget claim is not made, or the
// node's traffic cut is not confirmed (nodeguard's delay-deletion annotation
// is still on; internal/autoscaler removes it once both are done, or past
// --admin-state-timeout). cluster-autoscaler does not cordon by default: it
// taints and evicts at once, and its evictions must wait, or a scale-down the
// budgets refuse would drain the node all the same, and its pods would go
// while the load balancer still sends them connections. cluster-autoscaler
// retries a refused eviction every 10 s for --max-pod-eviction-time (2 min),
// then abandons the scale-down and removes its taint.
func (h *EvictionHandler) scaleDownHeld(node *corev1.Node) bool {
	if !ngv1alpha1.ScaleDownTainted(node) || !h.Signals.ScaleDownClaims() || otherSignal(node, h.Signals) {
		return false
	}
	_, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
	_, holding := node.Annotations[ngv1alpha1.DelayDeletionAnnotation]
	return !claimed || holding
}

// otherSignal reports whether the node carries a signal taint besides
// cluster-autoscaler's that charges nothing (an out-of-service, shutdown or
// spot-evicted node): such a node cannot wait for a scale-down's hold.
func otherSignal(node *corev1.Node, signals *ngv1alpha1.Signals) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
		_, signal := signals.Of(t)
		return signal && t.Key != ngv1alpha1.ClusterAutoscalerTaintKey && !signals.AwaitsDisruptionClaim(node, t)
	})
}

// scaleDownWait is the 429 for an eviction from a node whose scale-down is
// held: not yet charged to its budgets, or its traffic not yet cut.
func (h *EvictionHandler) scaleDownWait(node *corev1.Node, pod string) decision {
	if _, claimed := node.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]; claimed {
		return decision{code: http.StatusTooManyRequests, reason: reasonTrafficCut, message: fmt.Sprintf(
			"evicting pod %s: node %s's load-balancer traffic is being cut (AdminState Down) before its pods go; retry in a few seconds",
			pod, node.Name)}
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonScaleDownUnclaimed, message: fmt.Sprintf(
		"cluster-autoscaler's scale-down of node %s is not admitted by its NodeDisruptionBudgets yet (nodeguard claims it when the node is tainted %s); retry: "+
			"a scale-down the budgets keep refusing fails its drain, and cluster-autoscaler keeps the node", node.Name, ngv1alpha1.ClusterAutoscalerTaintKey)}
}

// withRecentMark puts the drain mark this replica wrote on a node the cache
// shows without it yet.
func (h *EvictionHandler) withRecentMark(node *corev1.Node) {
	v, ok := h.recent.Load(node.UID)
	if !ok {
		return
	}
	marked := v.(*corev1.Node)
	at, _ := ngv1alpha1.AnnotationTime(marked, ngv1alpha1.DrainChargedAtAnnotation)
	if _, cached := ngv1alpha1.DrainCharged(node); cached || h.Clock.Since(at) > recentMarkLifetime || newerThan(node, marked) {
		// The cache shows the mark, or a version of the node after it (the
		// drain ended and its marks went): the mark stands in no more.
		h.recent.Delete(node.UID)
		return
	}
	*node = *marked
}

// newerThan reports whether a is a later version of the node than b.
// ResourceVersions are opaque, but etcd's are increasing numbers; one that
// does not parse is never newer, and the mark then stands in until its
// lifetime ends, as before.
func newerThan(a, b *corev1.Node) bool {
	av, err1 := strconv.ParseUint(a.ResourceVersion, 10, 64)
	bv, err2 := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return err1 == nil && err2 == nil && av > bv
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

// firstCharge is the outcome of charging a node's drain, shared by the
// evictions that asked at once.
type firstCharge struct {
	d      decision
	marked *corev1.Node
}

// chargeFirst charges the drain of the node to its budgets and marks it, once
// for all the evictions that ask at the same time; it returns the marked node
// (nil when the rule let the drain go without a mark: the node's instance is
// gone). A dry run decides alone and writes nothing.
func (h *EvictionHandler) chargeFirst(ctx context.Context, node *corev1.Node, pod, user string, dryRun bool) (decision, *corev1.Node, error) {
	if dryRun {
		d, err := h.charge(ctx, node, pod, user, true)
		return d, nil, err
	}
	v, err, _ := h.first.Do(string(node.UID), func() (any, error) {
		d, err := h.charge(ctx, node, pod, user, false)
		if err != nil || !d.allowed || d.reason == reasonInstanceGone {
			return firstCharge{d: d}, err
		}
		marked, err := h.mark(ctx, node, user, pod, d.claimed)
		return firstCharge{d: d, marked: marked}, err
	})
	fc, _ := v.(firstCharge)
	return fc.d, fc.marked, err
}

// charge applies the rule to the drain. A maintenance Lease someone else holds
// does not refuse it: a Lease holder that cordons and drains the node is the
// drainer (the drain rule reads no Lease: budget.Rules), so a budget is all
// that refuses.
func (h *EvictionHandler) charge(ctx context.Context, node *corev1.Node, pod, user string, dryRun bool) (decision, error) {
	v, err := h.Rule.Decide(ctx, node, dryRun)
	if err != nil {
		return decision{}, err
	}
	d := fromVerdict(v, wording{
		refusing:  fmt.Sprintf("evicting pod %s from node %s (drain by %s)", pod, node.Name, user),
		admitting: fmt.Sprintf("the drain of node %s by %s is", node.Name, user),
		drain:     true,
	})
	if !d.allowed {
		d.message += h.holders(ctx, d.denier)
	}
	if !dryRun {
		h.record(node, user, d)
	}
	return d, nil
}

// holders names the nodes the refusing budget counts out, for the refusal.
func (h *EvictionHandler) holders(ctx context.Context, ndb *ngv1alpha1.NodeDisruptionBudget) string {
	if ndb == nil {
		return ""
	}
	sel, err := budget.Selector(ndb)
	if err != nil {
		return ""
	}
	var nodes corev1.NodeList
	if err := h.Nodes.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return ""
	}
	var out []string
	for i := range nodes.Items {
		if unavailable, why := budget.Unavailable(&nodes.Items[i], h.Signals); unavailable {
			out = append(out, fmt.Sprintf("%s (%s)", nodes.Items[i].Name, why))
		}
	}
	for name := range ndb.Status.DisruptedNodes {
		if !slices.ContainsFunc(out, func(s string) bool { return strings.HasPrefix(s, name+" ") }) {
			out = append(out, name+" (charged)")
		}
	}
	if len(out) == 0 {
		return ""
	}
	slices.Sort(out)
	return "; held by " + strings.Join(out, ", ")
}

// mark records on the node that its drain was charged, by whom, and for the
// eviction of which pod (what confirms the charge: see
// ngv1alpha1.DrainFirstEvictionAnnotation). A failed write gives the charges
// back: the eviction is refused with "retry".
func (h *EvictionHandler) mark(ctx context.Context, node *corev1.Node, user, pod string, charged []budget.Charged) (*corev1.Node, error) {
	marked := node.DeepCopy()
	patch := client.MergeFrom(node)
	ngv1alpha1.MarkDrainCharged(marked, h.Clock.Now(), user, pod)
	if err := h.Client.Patch(ctx, marked, patch); err != nil {
		if gerr := h.Rule.Claimer.GiveBack(ctx, charged, node.Name); gerr != nil {
			logf.FromContext(ctx).Error(gerr, "Giving back the charges of a drain whose mark failed", "node", node.Name)
		}
		return nil, fmt.Errorf("marking the drain of node %s charged: %w", node.Name, err)
	}
	h.recent.Store(node.UID, marked)
	return marked, nil
}

// awaitTrafficCut refuses evictions from a charged node ("retry") until its
// traffic cut has ended (the TrafficCut condition) or, unless the policy is
// wait, --admin-state-timeout after the charge.
func (h *EvictionHandler) awaitTrafficCut(node *corev1.Node, pod string) decision {
	if !h.Traffic.Enabled {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf("the drain of node %s is charged to its budgets", node.Name)}
	}
	if _, ended := ngv1alpha1.TrafficCutEnded(node, h.Traffic.Wait); ended {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf("the drain of node %s is charged and its traffic cut ended (condition %s)", node.Name, ngv1alpha1.TrafficCutCondition)}
	}
	chargedAt, ok := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainChargedAtAnnotation)
	left := chargedAt.Add(h.Traffic.Timeout).Sub(h.Clock.Now())
	if ok && left <= 0 && !h.Traffic.Wait {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf(
			"the drain of node %s is charged; Azure did not confirm its traffic cut within --admin-state-timeout (%s)", node.Name, h.Traffic.Timeout)}
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonTrafficCut, message: fmt.Sprintf(
		"evicting pod %s: node %s's load-balancer traffic is being cut (AdminState Down) before its pods go; retry in a few seconds",
		pod, node.Name)}
}

// record emits the events of a charge decision on the node and the budgets.
func (h *EvictionHandler) record(node *corev1.Node, user string, d decision) {
	events := doorEvents{recorder: h.Recorder, action: actionAdmitEviction,
		refusedReason: ReasonDrainDenied, admittedReason: ReasonDrainCharged}
	switch {
	case !d.allowed:
		events.refused(node, d)
	case d.reason == reasonCharged:
		events.admitted(node, d.claimed, func(ndb string) string {
			return fmt.Sprintf("drain of node %s by %s counted against NodeDisruptionBudget %s", node.Name, user, ndb)
		}, d.message+": the node counts unavailable and its traffic is cut until it is schedulable and Ready again")
	}
}
