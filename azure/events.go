package azure

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Event reasons on the Node (an API: keep them stable).
const (
	ReasonDown           = "LoadBalancerAdminStateDown"
	ReasonNone           = "LoadBalancerAdminStateNone"
	ReasonUpdateFailed   = "LoadBalancerAdminStateUpdateFailed"
	ReasonUpdateRetrying = "LoadBalancerAdminStateUpdateRetrying"
	// ReasonNoEntry (Warning): a NIC-based pool has the node as a member but
	// no entry that could carry an admin state; its traffic is not cut there.
	ReasonNoEntry = "LoadBalancerAdminStateNoEntry"
	// ReasonRestoredAfterNodeGone: the entries nodeguard set Down for a node
	// that is gone are None again.
	ReasonRestoredAfterNodeGone = "LoadBalancerAdminStateRestoredAfterNodeGone"
	// ReasonRecordUnreadable (Warning, on the record Lease): a record of the
	// entries nodeguard set Down does not parse and is skipped.
	ReasonRecordUnreadable = "LoadBalancerAdminStateRecordUnreadable"
	// ReasonReverted (Warning): an entry of a node held Down was found not
	// Down (another writer put the pool back from an older copy, or added the
	// node at None); nodeguard sets it Down again. Or an entry nodeguard
	// restored was found Down within --azure-admin-state-restore-hold (put
	// back from a copy read while the node was Down); nodeguard sets it None
	// again.
	ReasonReverted = "LoadBalancerAdminStateReverted"
	// ReasonRecordIgnored (Warning, on the Lease): a Lease claims to be the
	// admin-state record of a pool but is not the one nodeguard keeps for it;
	// nodeguard ignores it.
	ReasonRecordIgnored = "LoadBalancerAdminStateRecordIgnored"
	// ReasonNoBackendPool (Warning): the node is in no backend pool of the
	// managed load balancers, so setting it Down changed nothing: a node
	// excluded from load balancers, or a configuration that names the wrong
	// resource group or load balancers.
	ReasonNoBackendPool = "LoadBalancerAdminStateNoBackendPool"

	eventAction = "UpdateLoadBalancerAdminState"
)

type event struct {
	warning bool
	reason  string
	note    string
	// pool, for an event whose pools each tell something of their own
	// (a revert, a missing entry), keeps it apart from another pool's in a
	// round; the retries and failures of one round are one story per node.
	pool string
}

func confirmedEvent(state AdminState, pools int) event {
	reason := ReasonNone
	if state == AdminStateDown {
		reason = ReasonDown
	}
	return event{reason: reason, note: fmt.Sprintf("Azure load balancer admin state %s confirmed on the node's entries in %d backend pool(s)", state, pools)}
}

func noBackendPoolEvent(resourceGroup, unknown string) event {
	why := "check --azure-resource-group and --azure-load-balancers if it should be"
	if unknown != "" {
		why = "Azure does not know the configuration: " + unknown
	}
	return event{warning: true, reason: ReasonNoBackendPool, note: fmt.Sprintf(
		"The node is in no backend pool of the managed load balancers in resource group %s: no traffic to it was cut (%s)", resourceGroup, why)}
}

func retryingEvent(pool string, attempt, maxRetries int, err string, at time.Time) event {
	return event{warning: true, reason: ReasonUpdateRetrying,
		note: fmt.Sprintf("Updating backend pool %s failed (attempt %d of %d), retrying after %s: %s", pool, attempt, maxRetries+1, at.UTC().Format(time.RFC3339), err)}
}

// busyEvent: the load balancer is busy with another writer's operation.
// Busy is not failure: no retry is spent, and the entry is written once the
// operation ends.
func busyEvent(pool string, err string, at time.Time) event {
	return event{warning: true, reason: ReasonUpdateRetrying,
		note: fmt.Sprintf("Backend pool %s: another operation is updating its load balancer (on AKS usually cloud-provider-azure); nodeguard waits for it and tries again after %s, for as long as the node's desired admin state stands, without spending a retry: %s", pool, at.UTC().Format(time.RFC3339), err)}
}

func failedEvent(pool string, err string, next time.Time) event {
	return event{warning: true, reason: ReasonUpdateFailed,
		note: fmt.Sprintf("Backend pool %s update failed: %s. It is tried again at %s, then at that interval for as long as the node's desired admin state stands (reported once).", pool, err, next.UTC().Format(time.RFC3339))}
}

func exhaustedEvent(pool string, retries int, err string, next time.Time, ceiling time.Duration) event {
	return event{warning: true, reason: ReasonUpdateFailed,
		note: fmt.Sprintf("Backend pool %s update failed after %d retries: %s. It is tried again at %s, then with a backoff of up to %s for as long as the node's desired admin state stands (reported once); check ARM throttling and other writers of the pool.", pool, retries, err, next.UTC().Format(time.RFC3339), ceiling)}
}

func noEntryEvent(pool string) event {
	return event{pool: pool, warning: true, reason: ReasonNoEntry,
		note: fmt.Sprintf("Backend pool %s lists the node only through its NIC's IP configuration (backendIPConfigurations), with no backend-address entry to carry an admin state; ARM does not let a client add one, so the node is NOT Down in this pool and keeps receiving new connections there until its health probe fails.", pool)}
}

func listFailedEvent(resourceGroup, err string, at time.Time) event {
	return event{warning: true, reason: ReasonUpdateRetrying,
		note: fmt.Sprintf("Listing the load balancers in resource group %s failed, so the node's backend pools are unknown; retrying after %s: %s", resourceGroup, at.UTC().Format(time.RFC3339), err)}
}

func goneRestoredEvent(n *nodeState) event {
	why := "was gone for the grace period (--azure-admin-state-gone-node-grace)"
	if n.gone.due == dueReplaced {
		why = fmt.Sprintf("was replaced by a node of the same name (UID %s)", n.gone.replacement)
	}
	return event{reason: ReasonRestoredAfterNodeGone,
		note: fmt.Sprintf("Node %s (UID %s) %s: restored None on the load-balancer backend entries nodeguard had set Down for it", n.name, n.uid, why)}
}

func unreadableEvent(u UnreadableRecord) event {
	return event{warning: true, reason: ReasonRecordUnreadable,
		note: fmt.Sprintf("%v. nodeguard skips this record and goes on with the others: the entries it lists as set Down are not restored to None by nodeguard (check them yourself), and the next write to its pool replaces it.", u)}
}

func revertedEvent(pool, entry string) event {
	return event{pool: pool, warning: true, reason: ReasonReverted,
		note: fmt.Sprintf("Backend pool %s: entry %s of this node, which nodeguard holds Down, was found not Down: another writer of the pool (cloud-provider-azure writes whole pools as it read them) put it back or added it at None. nodeguard sets it Down again now. Repeated events mean the two keep fighting over the pool.", pool, entry)}
}

func revertedRestoreEvent(pool, entry string, restoredAt time.Time) event {
	return event{pool: pool, warning: true, reason: ReasonReverted,
		note: fmt.Sprintf("Backend pool %s: entry %s of this node, which nodeguard restored to None at %s, was found Down: another writer of the pool (cloud-provider-azure writes whole pools from the copy it read, up to minutes old) put back a copy read while the node was Down. nodeguard sets it None again now, and holds None until --azure-admin-state-restore-hold has passed since the restore.", pool, entry, restoredAt.UTC().Format(time.RFC3339))}
}

func ignoredRecordEvent(r IgnoredRecord) event {
	return event{warning: true, reason: ReasonRecordIgnored,
		note: fmt.Sprintf("%v. nodeguard reads a pool's record only from the Lease it keeps for that pool (%s), and ignores this one: what it lists changes nothing nodeguard does.", r, leaseName(r.Pool))}
}

// pendingEvent is an event for a node, emitted once m.mu is released.
type pendingEvent struct {
	node *nodeState
	ev   event
}

// emit records events, one per node, reason and pool per tick.
func (m *Manager) emit(ev *tickEvents, events []pendingEvent) {
	if m.recorder == nil {
		return
	}
	for _, e := range events {
		k := fmt.Sprintf("%s/%d/%s/%s", e.node.uid, e.node.gen, e.ev.reason, e.ev.pool)
		ev.mu.Lock()
		dup := ev.seen[k]
		ev.seen[k] = true
		ev.mu.Unlock()
		if dup {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.ev.warning {
			typ = corev1.EventTypeWarning
		}
		m.recorder.Eventf(regarding(e.node), nil, typ, e.ev.reason, eventAction, "%s", e.ev.note)
	}
}
