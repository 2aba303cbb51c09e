package webhook

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// The charge of someone else's drain: its first eviction from a node charges
// the node's budgets by the drain rule and marks the node (once for all the
// evictions that ask at the same time); the later ones renew the ask of a
// charge not yet confirmed.

// recentMarkLifetime bounds how long a written mark stands in for the cache.
const recentMarkLifetime = 30 * time.Second

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
