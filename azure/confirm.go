package azure

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// updateConfirmed marks a node confirmed once no pool has work left, and
// returns the confirmation event when nodeguard changed its entries, but for
// a node being deleted: the termination controller says the cut in its one
// NodeReleased event (each event written is a write a fleet's deletion pays
// per node). Call with m.mu held.
func (m *Manager) updateConfirmed(n *nodeState) []pendingEvent {
	if n.confirmed || !n.known || n.gone != nil {
		return nil
	}
	if n.hasPendingWork() {
		return nil
	}
	if n.anyFailed() {
		n.signal() // settled, some pool failed: WaitConfirmed reports it
		return nil
	}
	n.confirmed = true
	n.failed = nil
	n.signal()
	confirmDuration.WithLabelValues(string(n.desired)).Observe(m.clock.Since(n.since).Seconds())
	if n.nothingCut() {
		return []pendingEvent{{n, noBackendPoolEvent(m.cfg.ResourceGroup, m.unknown)}}
	}
	if !n.changed || (n.deleting && n.desired == AdminStateDown) {
		return nil
	}
	return []pendingEvent{{n, confirmedEvent(n.desired, len(n.pools))}}
}

// nothingCut reports whether the node is confirmed Down in no backend pool
// while nothing says it should be in none: nodeguard wrote none of its
// entries, no discovery found it in a pool (cloud-provider-azure removes a
// node being deleted or excluded: that is a harder cut), and it does not carry
// the exclusion label. A configuration that names the wrong resource group or
// load balancers looks like this. Call with m.mu held.
func (n *nodeState) nothingCut() bool {
	return n.desired == AdminStateDown && len(n.pools) == 0 && !n.changed && !n.member && !n.excluded
}

// noteLeft notes that the node's entries left a pool while it was held
// Down. Call with m.mu held.
func (n *nodeState) noteLeft(pool string) {
	if n.left == nil {
		n.left = map[string]bool{}
	}
	n.left[pool] = true
}

// CutNote says, for the TrafficCut condition of a node whose Down is
// confirmed, how its traffic was cut when that was not AdminState Down
// alone: the backend pools its entries left (their owner, cloud-provider-azure,
// removes the entries of a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers, as Karpenter
// labels a node it drains). It is empty otherwise.
func (m *Manager) CutNote(uid types.UID) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.nodes[uid]
	if n == nil || n.gone != nil || n.desired != AdminStateDown || len(n.left) == 0 {
		return ""
	}
	pools := slices.Sorted(maps.Keys(n.left))
	return fmt.Sprintf("the node's entries left backend pool(s) %s: removed by their owner (cloud-provider-azure takes a node labelled %s, as Karpenter labels a node it drains, out of its load balancers), a harder cut than AdminState Down; nothing to restore there when the node comes back",
		strings.Join(pools, ", "), corev1.LabelNodeExcludeBalancers)
}

// Confirmation is where a node's desired admin state stands with Azure.
type Confirmation int

const (
	// ConfirmPending: writes of the state are still in flight.
	ConfirmPending Confirmation = iota
	// Confirmed: Azure confirmed the state on every entry of the node.
	Confirmed
	// ConfirmFailed: applying the state failed for good in a pool, and no
	// other write of the node is in flight (the error says which).
	ConfirmFailed
	// ConfirmUnknown: the manager cannot say (the node is not tracked or was
	// forgotten, the manager stopped, or ctx ended; the error says which).
	ConfirmUnknown
)

// Confirmation asks where the node's state stands, waiting at most wait (0:
// not at all) for it to be confirmed: the one reading of WaitConfirmed that
// the termination, the scale-down hold and the taint watcher share. The
// error is the *UpdateFailedError with ConfirmFailed, and what keeps the
// manager from answering with ConfirmUnknown.
func (m *Manager) Confirmation(ctx context.Context, uid types.UID, state AdminState, wait time.Duration) (Confirmation, error) {
	waitCtx, cancel := context.WithTimeout(ctx, wait) // already over at 0: WaitConfirmed looks before it waits
	defer cancel()
	err := m.WaitConfirmed(waitCtx, uid, state)
	var failed *UpdateFailedError
	switch {
	case err == nil:
		return Confirmed, nil
	case errors.As(err, &failed):
		return ConfirmFailed, err
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return ConfirmPending, nil // waitCtx's deadline, not the caller's
	}
	return ConfirmUnknown, err
}
