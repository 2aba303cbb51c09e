package finalizer

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// nodeMemory is what the controller remembers of one node between its
// passes. It is derived state: a restart loses it, and passes rebuild it
// from the node. forget drops it whole.
type nodeMemory struct {
	// reported are the keys said once (once): events per pod or holder.
	reported map[string]bool
	// wait is what the drain waits for and since when (a stall), waiting
	// the last DrainWaiting event, and backoff the drain's backstop while
	// every queue is blocked (without a pod watch).
	wait    writtenMessage
	waiting writtenMessage
	backoff time.Duration
	// queues are the PDBs the node's eviction queues wait on, so that a PDB
	// change wakes only the nodes it concerns; nil until the first drain
	// pass (then every PDB change wakes the node).
	queues map[types.UID]bool
	// waitingFor is what the current phase waits for, and condition the
	// Terminating condition last written (reportCondition).
	waitingFor string
	condition  writtenCondition
	// staged are the condition changes not written yet; status writes
	// them (status.go).
	staged *stagedConditions
	status *statusWriter
	// written are the conditions this process wrote last, by type (nil:
	// removed): a draining node is read from the cache, which may not have
	// seen the write yet, and must not stage it again.
	written map[corev1.NodeConditionType]*corev1.NodeCondition
	// drainedAt is when the drain ended (recordDrained).
	drainedAt time.Time
	// cutWait: a background wait for the traffic cut will wake the node.
	cutWait bool
	// cutEnded is when the traffic cut ended, to the nanosecond; the
	// TrafficCut condition keeps it to the second across restarts.
	cutEnded time.Time
	// done are the steps of the termination taken, for NodeReleased.
	done []string
	// losses are the evicted pods a user may regret, not said yet (losses.go).
	losses podLosses
	// passing: a termination pass of the node is in flight, and writes what
	// is due at its end; its timer leaves the write to it.
	passing bool
	// cordonSeen is when a pass first found the node cordoned, no drain
	// under way (pickUp).
	cordonSeen time.Time
}

// remember returns the node's memory, made on first use. Call with r.mu held.
func (r *Reconciler) remember(uid types.UID) *nodeMemory {
	if r.memory == nil {
		r.memory = map[types.UID]*nodeMemory{}
	}
	m := r.memory[uid]
	if m == nil {
		m = &nodeMemory{}
		r.memory[uid] = m
	}
	return m
}

// recall returns the node's memory without making one (a zero memory for a
// node there is none of). Call with r.mu held.
func (r *Reconciler) recall(uid types.UID) *nodeMemory {
	if m := r.memory[uid]; m != nil {
		return m
	}
	return &nodeMemory{}
}

// rememberQueues records the PDBs the node's drain waits on.
func (r *Reconciler) rememberQueues(uid types.UID, groups []drain.Group) {
	queues := make(map[types.UID]bool, len(groups))
	for _, g := range groups {
		queues[g.UID] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remember(uid).queues = queues
}

// once reports whether key is new for the node, remembering it.
func (r *Reconciler) once(node types.UID, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(node)
	if m.reported[key] {
		return false
	}
	if m.reported == nil {
		m.reported = map[string]bool{}
	}
	m.reported[key] = true
	return true
}

// cordonSeenAt returns when a pass first found the node cordoned with no drain
// under way, remembering now if none did.
func (r *Reconciler) cordonSeenAt(uid types.UID, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(uid)
	if m.cordonSeen.IsZero() {
		m.cordonSeen = now
	}
	return m.cordonSeen
}
