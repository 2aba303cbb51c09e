package budget

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Pruning disruptedNodes safely while another status controller may write
// from an older view of the nodes (two leaders at a hand-over, or one whose
// node watch lags).
//
// A claim only leaves the map when no view, however stale, can count its node
// available again because of it:
//   - a node seen deleting keeps its claim until it is gone: a controller that
//     still sees it Ready, not yet deleting, then counts it charged, not
//     available (pruning it on "seen unavailable" let a stale view count a
//     claimed node that flipped NotReady and Ready again available);
//   - a node the cache does not have (gone, not yet seen, relabelled) keeps its
//     claim until the API server confirms it is gone or no longer selected;
//   - an expired claim, and a claim given back unconfirmed, are dropped only
//     when a fresh read of the node shows it not deleting (nor disrupted).
//
// The fresh reads happen before the status write, outside the claims' group
// commit; a claim whose deadline passes in between is kept and looked at
// again in confirmRetry.

// DefaultUnconfirmedClaimTimeout is how long a claim may wait for its node to
// show its disruption under way (deleting, draining, or scaled down by
// cluster-autoscaler) before it is given back. An admitted Node DELETE sets the
// node's deletionTimestamp within milliseconds; a claim that shows nothing is a
// delete denied by a later admission step, or a forged admission review. It is
// three times the webhook's 5 s timeout.
const DefaultUnconfirmedClaimTimeout = 15 * time.Second

// confirmRetry is how soon a claim is looked at again when the cache and the
// API server disagree about its node (the cache lags behind).
const confirmRetry = time.Second

// pendingRetry is how soon an expired claim whose disruption is still on its
// way is asked about again: a node's change (its deletion) wakes it sooner.
const pendingRetry = 10 * time.Second

// claimFate is what becomes of one claim in a status pass.
type claimFate int

const (
	claimKept claimFate = iota
	// claimDropped: the node is gone or no longer selected, or the claim expired.
	claimDropped
	// claimUnconfirmed: given back, its node showed no disruption in time.
	claimUnconfirmed
)

// UnconfirmedClaim is a claim given back because its node showed no
// disruption within the unconfirmed-claim timeout.
type UnconfirmedClaim struct {
	Node      string
	ClaimedAt time.Time
	// Seen is the node as the API server returned it.
	Seen *corev1.Node
}

// claimReview decides a budget's claims in one reconcile: from the cached
// nodes, and from fresh reads of the nodes whose claim the cache alone must
// not drop.
type claimReview struct {
	r      *StatusReconciler
	sel    labels.Selector
	cached map[string]*corev1.Node // the selected nodes of the cache
	// fresh holds the API server's answer for each node read (nil: gone).
	fresh map[string]*corev1.Node
	// unconfirmed are the claims the last prune gave back unconfirmed.
	unconfirmed []UnconfirmedClaim
	// uncached are the nodes of the claims the last prune kept that the cache
	// does not have: as the API server returned them, or a stub.
	uncached []*corev1.Node
	// pending are the expired claims whose disruption is still on its way
	// (StatusReconciler.DisruptionPending).
	pending map[string]bool
}

func (r *StatusReconciler) newClaimReview(ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node) *claimReview {
	sel, err := Selector(ndb)
	if err != nil {
		sel = labels.Nothing()
	}
	cached := make(map[string]*corev1.Node, len(selected))
	for _, n := range selected {
		cached[n.Name] = n
	}
	return &claimReview{r: r, sel: sel, cached: cached, fresh: map[string]*corev1.Node{}, pending: map[string]bool{}}
}

// listFreshAbove is how many nodes readFresh reads one by one; for more (the
// claims of a fleet deletion whose nodes are gone), one List of the budget's
// selected nodes answers them all in one round trip.
const listFreshAbove = 8

// readFresh reads from the API server every claimed node whose claim the
// cache alone cannot drop at now.
func (c *claimReview) readFresh(ctx context.Context, claims map[string]metav1.Time, now time.Time) error {
	var names []string
	for name, at := range claims {
		if _, _, ask := c.judge(name, at.Time, now); ask {
			names = append(names, name)
		}
	}
	if len(names) > listFreshAbove {
		if err := c.listFresh(ctx, names); err != nil {
			return err
		}
		c.readPending(ctx, claims, now)
		return nil
	}
	for _, name := range names {
		var node corev1.Node
		err := c.r.Reader.Get(ctx, client.ObjectKey{Name: name}, &node)
		switch {
		case apierrors.IsNotFound(err):
			c.fresh[name] = nil
		case err != nil:
			return fmt.Errorf("reading claimed node %s: %w", name, err)
		default:
			c.fresh[name] = &node
		}
	}
	c.readPending(ctx, claims, now)
	return nil
}

// readPending asks, for each expired claim whose node the API server shows
// present and not deleting, whether its disruption is still on its way.
func (c *claimReview) readPending(ctx context.Context, claims map[string]metav1.Time, now time.Time) {
	if c.r.DisruptionPending == nil {
		return
	}
	for name, at := range claims {
		fresh := c.fresh[name]
		if fresh == nil || fresh.DeletionTimestamp != nil || c.cached[name] == nil || at.Add(c.r.ClaimTimeout).After(now) {
			continue
		}
		pending, err := c.r.DisruptionPending(ctx, fresh)
		switch {
		case err != nil:
			// Kept: dropping a claim whose disruption may still come
			// over-admits; the budget's other claims and numbers go on.
			logf.FromContext(ctx).Error(err, "Keeping an expired disruption claim: cannot tell whether its disruption is still on its way", "node", name, "claimedAt", at.Time)
			pending = true
		case pending:
			logf.FromContext(ctx).Info("Keeping a disruption claim past --disruption-claim-timeout: its disruption is still on its way (a NodeClaim being deleted)", "node", name, "claimedAt", at.Time)
		}
		c.pending[name] = pending
	}
}

// listFreshPage is the most nodes one page of listFresh asks for. At fleet
// size a budget selects thousands of nodes of 10 to 20 KB each: a list read
// whole is tens of MB live at once, and the garbage collector's next goal
// doubles that. A page at a time, only the claimed nodes outlive their page.
const listFreshPage = 250

// listFresh answers the reads of names with a List of the nodes the budget
// selects, a page at a time (one snapshot: the pages continue the first
// one's): a node not in it is gone or no longer selected, which judge treats
// alike.
func (c *claimReview) listFresh(ctx context.Context, names []string) error {
	wanted := make(map[string]bool, len(names))
	for _, name := range names {
		wanted[name] = true
		c.fresh[name] = nil // until a page lists it
	}
	for next := ""; ; {
		var page corev1.NodeList
		if err := c.r.Reader.List(ctx, &page, client.MatchingLabelsSelector{Selector: c.sel},
			client.Limit(listFreshPage), client.Continue(next)); err != nil {
			return fmt.Errorf("listing the budget's nodes to confirm %d claims: %w", len(names), err)
		}
		for i := range page.Items {
			if node := page.Items[i]; wanted[node.Name] {
				c.fresh[node.Name] = &node // a copy: the page itself goes
			}
		}
		if next = page.Continue; next == "" {
			return nil
		}
	}
}

// prune returns the claims kept at now, with when one must be looked at
// again, and notes those given back unconfirmed.
func (c *claimReview) prune(claims map[string]metav1.Time, now time.Time) (map[string]metav1.Time, time.Time) {
	c.unconfirmed, c.uncached = nil, nil
	kept := map[string]metav1.Time{}
	var earliest time.Time
	for name, at := range claims {
		fate, next, ask := c.judge(name, at.Time, now)
		if ask {
			next = now.Add(confirmRetry) // not read before this pass: keep, look again
		}
		switch fate {
		case claimUnconfirmed:
			c.unconfirmed = append(c.unconfirmed, UnconfirmedClaim{Node: name, ClaimedAt: at.Time, Seen: c.fresh[name]})
			continue
		case claimDropped:
			continue
		}
		kept[name] = at
		c.keepUncached(name)
		if !next.IsZero() && (earliest.IsZero() || next.Before(earliest)) {
			earliest = next
		}
	}
	if len(kept) == 0 {
		return nil, earliest
	}
	return kept, earliest
}

// keepUncached notes the node of a kept claim that the cache does not have
// (created, charged and deleting before the cache saw it): it still counts
// among the budget's nodes, charged. Left out, it would take one node out of
// expectedNodes and none out of currentAvailable, and a maxUnavailable budget
// would allow one more.
func (c *claimReview) keepUncached(name string) {
	if c.cached[name] != nil {
		return
	}
	node := c.fresh[name]
	if node == nil {
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} // no Ready condition: unavailable
	}
	c.uncached = append(c.uncached, node)
}

// counted is the nodes the budget's numbers are computed from: the selected
// cached nodes and the uncached nodes of the claims kept.
func (c *claimReview) counted(selected []*corev1.Node) []*corev1.Node {
	if len(c.uncached) == 0 {
		return selected
	}
	return append(selected[:len(selected):len(selected)], c.uncached...)
}

// judge decides the claim of node name made at at: its fate, when to look at
// it again (zero: when its node changes), or ask when the decision needs a
// fresh read of the node that this review does not have yet.
func (c *claimReview) judge(name string, at, now time.Time) (fate claimFate, next time.Time, ask bool) {
	fresh, read := c.fresh[name]
	cached := c.cached[name]
	if cached == nil { // gone, not yet seen, or no longer selected
		switch {
		case !read:
			return claimKept, time.Time{}, true
		case fresh == nil || !c.sel.Matches(labels.Set(fresh.Labels)):
			return claimDropped, time.Time{}, false
		}
		return claimKept, now.Add(confirmRetry), false // the cache lags
	}
	if cached.DeletionTimestamp != nil {
		return claimKept, time.Time{}, false // until it is gone
	}
	expires := at.Add(c.r.ClaimTimeout)
	if !expires.After(now) {
		switch {
		case !read:
			return claimKept, time.Time{}, true
		case fresh != nil && fresh.DeletionTimestamp == nil && c.pending[name]:
			return claimKept, now.Add(pendingRetry), false // on its way: its node's delete is to come
		case fresh == nil || fresh.DeletionTimestamp == nil:
			return claimDropped, time.Time{}, false // the admitted delete never happened
		}
		return claimKept, now.Add(confirmRetry), false // deleting: the cache lags
	}
	if c.r.UnconfirmedTimeout <= 0 || DisruptionUnderWay(cached) {
		return claimKept, expires, false
	}
	deadline := at.Add(c.r.UnconfirmedTimeout)
	if deadline.After(now) {
		return claimKept, earlier(deadline, expires), false
	}
	switch {
	case !read:
		return claimKept, time.Time{}, true
	case fresh == nil:
		return claimDropped, time.Time{}, false
	case !DisruptionUnderWay(fresh):
		return claimUnconfirmed, time.Time{}, false
	}
	return claimKept, now.Add(confirmRetry), false // under way: the cache lags
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// DisruptionUnderWay reports whether the node shows that a disruption charged
// to its budgets has begun: it is being deleted, nodeguard drains it,
// cluster-autoscaler's scale-down of it is claimed, its NodeClaim's deletion
// was charged, or someone else's drain of it was. Each charge is followed by
// one of these within moments (a Node DELETE, the NodeClaim, scale-down or
// drain mark), so a
// claim that shows none after the unconfirmed-claim timeout was never
// followed by its disruption.
func DisruptionUnderWay(node *corev1.Node) bool {
	if node.DeletionTimestamp != nil || ngv1alpha1.ScaleDownClaimed(node) {
		return true
	}
	if _, charged := node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation]; charged {
		return true
	}
	if _, charged := ngv1alpha1.DrainCharged(node); charged {
		return true
	}
	for _, t := range node.Spec.Taints {
		if ngv1alpha1.IsDrainingTaint(t) {
			return true
		}
	}
	return false
}
