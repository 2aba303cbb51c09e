package finalizer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// A terminating node's conditions are staged by its passes and written
// once the oldest change has waited Options.StatusSettle (longer in a
// fleet's deletion: statusSettle), with whatever
// changed meanwhile: a wait that ends sooner (Azure confirming within a
// second, a drain that empties the node at once) is never written, and a
// node that goes with nodeguard's finalizer is not written at its release.
// Every status write of a node goes to every watcher of nodes, a fleet's
// worth of components.

// stagedConditions are the condition changes of a node not written yet:
// conditions to set, and types to remove. since is when the oldest of them
// was staged.
type stagedConditions struct {
	set    []corev1.NodeCondition
	remove []corev1.NodeConditionType
	since  time.Time
}

// statusWriter is a node's status writing: one write at a time, in the
// order the changes were staged, and the timer that writes them when due.
type statusWriter struct {
	writing chan struct{} // a lock that a timer's write and a pass share
	timer   *time.Timer
	due     time.Time // when the timer fires
}

// stageCondition sets one of nodeguard's node conditions in the node's next
// status write, keeping its transition time while its status stays, and on
// node, for the rest of the pass to read.
func (r *Reconciler) stageCondition(node *corev1.Node, c corev1.NodeCondition) {
	now := metav1.NewTime(r.Clock.Now())
	if c.LastHeartbeatTime.IsZero() {
		c.LastHeartbeatTime = now
	}
	c.LastTransitionTime = now
	if old := nodeCondition(node, c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		*old = c
	} else {
		node.Status.Conditions = append(node.Status.Conditions, c)
	}
	r.stage(node.UID, func(s *stagedConditions) {
		s.remove = slices.DeleteFunc(s.remove, func(t corev1.NodeConditionType) bool { return t == c.Type })
		s.set = append(slices.DeleteFunc(s.set, func(o corev1.NodeCondition) bool { return o.Type == c.Type }), c)
	})
}

// stageRemoval removes a condition in the node's next status write.
func (r *Reconciler) stageRemoval(node *corev1.Node, typ corev1.NodeConditionType) {
	node.Status.Conditions = slices.DeleteFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == typ })
	r.stage(node.UID, func(s *stagedConditions) {
		s.set = slices.DeleteFunc(s.set, func(o corev1.NodeCondition) bool { return o.Type == typ })
		s.remove = append(s.remove, typ)
	})
}

func (r *Reconciler) stage(uid types.UID, change func(*stagedConditions)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(uid)
	if m.staged == nil {
		m.staged = &stagedConditions{since: r.Clock.Now()}
	}
	change(m.staged)
}

// overlayStaged applies to a node read for a pass the conditions this
// process wrote (which a cached read may not show yet), then the changes
// staged and not written yet: the pass reads its conditions as they will be.
func (r *Reconciler) overlayStaged(node *corev1.Node) {
	r.mu.Lock()
	var staged stagedConditions
	var written []corev1.NodeCondition
	var removed []corev1.NodeConditionType
	if m := r.memory[node.UID]; m != nil {
		if m.staged != nil {
			staged = *m.staged
		}
		for typ, c := range m.written {
			if c == nil {
				removed = append(removed, typ)
			} else {
				written = append(written, *c)
			}
		}
	}
	r.mu.Unlock()
	staged.set = append(written, staged.set...)
	staged.remove = append(removed, staged.remove...)
	for _, c := range staged.set {
		if old := nodeCondition(node, c.Type); old != nil {
			*old = c
		} else {
			node.Status.Conditions = append(node.Status.Conditions, c)
		}
	}
	for _, typ := range staged.remove {
		node.Status.Conditions = slices.DeleteFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == typ })
	}
}

// flushConditions writes the staged changes at the end of a pass if the
// oldest has waited statusSettle; sooner, a timer writes them then, without a
// pass of its own.
func (r *Reconciler) flushConditions(ctx context.Context, node *corev1.Node) error {
	if wait := r.statusDue(node.UID); wait > 0 {
		r.flushLater(node, wait)
		return nil
	}
	return r.flushConditionsNow(ctx, node)
}

// statusDue is how long until the node's staged changes are due (0: now, or
// nothing staged).
func (r *Reconciler) statusDue(uid types.UID) time.Duration {
	settle := r.statusSettle(uid)
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.memory[uid]; m != nil && m.staged != nil {
		return max(settle-r.Clock.Since(m.staged.since), 0)
	}
	return 0
}

// fleetStatusSettle is how long a draining node's change waits in a fleet's
// deletion: more nodes terminate than drain at once, so nodes wait and drain
// for many seconds each, and every status write goes to every watcher of
// nodes. It is the kubelet's own pace of node status
// (--node-status-update-frequency).
const fleetStatusSettle = 10 * time.Second

// fleetLineSettle is how long a change waits in a fleet's deletion for a
// node that has not begun to drain: its steps before the drain (the Lease,
// the cordon, the traffic cut, the wait for a slot) are written once, when
// they have lasted that long together. A fleet's traffic cuts take seconds
// each (one ETag per load balancer), and its nodes wait in line for
// minutes; nodeguard_termination_nodes counts them by phase meanwhile.
const fleetLineSettle = 30 * time.Second

// statusSettle is how long a change of the node waits before it is written:
// StatusSettle, or in a fleet's deletion fleetLineSettle until the node
// begins to drain and fleetStatusSettle after (unless no settle is asked
// for: 0 writes at the end of each pass).
func (r *Reconciler) statusSettle(uid types.UID) time.Duration {
	switch {
	case r.Opts.StatusSettle <= 0:
		return 0
	case !r.fleetDeleting():
		return r.Opts.StatusSettle
	case r.slots.hasBegun(uid):
		return max(r.Opts.StatusSettle, fleetStatusSettle)
	}
	return max(r.Opts.StatusSettle, fleetLineSettle)
}

// fleetDeleting reports a fleet's deletion: more nodes terminate than
// --max-concurrent-drains. It holds from the first pass of each node, while
// all of them still cordon and cut traffic, before any has come to wait for
// a slot; a node that waits implies it (the slots' holders and the line are
// all terminating nodes).
func (r *Reconciler) fleetDeleting() bool {
	limit := r.Opts.MaxConcurrentNodes
	return limit > 0 && r.phases.count() > limit // 0: no limit, no wait
}

// flushLater arms the node's timer, unless it is armed to fire as soon: a
// node that begins to drain in a fleet's deletion settles sooner than it did
// in line.
func (r *Reconciler) flushLater(node *corev1.Node, wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.statusWriter(r.remember(node.UID))
	due := r.Clock.Now().Add(wait)
	if w.timer != nil {
		if !due.Before(w.due) {
			return
		}
		w.timer.Stop()
	}
	key := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID}}
	w.timer, w.due = time.AfterFunc(wait, func() { r.flushTimed(key) }), due
}

// flushTimed writes what is due when the timer fires, unless a pass of the
// node is in flight: a drain pass waits for its evictions, seconds under a
// fleet's load, and a write amid it would carry the drain's start
// (DrainInProgress) without the Draining condition the pass stages at its
// end, which then takes a write of its own. A failed write wakes the node:
// its pass stages the changes again.
func (r *Reconciler) flushTimed(node *corev1.Node) {
	r.mu.Lock()
	m := r.memory[node.UID]
	if m != nil && m.status != nil {
		m.status.timer = nil
	}
	inPass := m != nil && m.passing
	r.mu.Unlock()
	if inPass {
		return // the pass writes what is due at its end (flushConditions)
	}
	if wait := r.statusDue(node.UID); wait > 0 {
		r.flushLater(node, wait)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusWriteTimeout)
	defer cancel()
	if err := r.flushConditionsNow(ctx, node); err != nil {
		logf.Log.WithName("termination").Error(err, "Writing the conditions of a terminating node", "node", node.Name)
		wakeNode(ctx, r.wakeups, node.Name)
	}
}

// markPassing marks a termination pass of the node in flight, or over.
func (r *Reconciler) markPassing(uid types.UID, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.remember(uid).passing = true
	} else if m := r.memory[uid]; m != nil {
		m.passing = false // a node released in the pass is forgotten
	}
}

// statusWriteTimeout bounds a timer's status write.
const statusWriteTimeout = 30 * time.Second

// flushConditionsNow writes the staged changes whatever their age. Writes of
// one node go one at a time, each with what was staged when it began: a
// later change is never overwritten by an earlier one.
func (r *Reconciler) flushConditionsNow(ctx context.Context, node *corev1.Node) error {
	r.mu.Lock()
	m := r.memory[node.UID]
	if m == nil || m.staged == nil {
		r.mu.Unlock()
		return nil
	}
	w := r.statusWriter(m)
	r.mu.Unlock()
	select {
	case w.writing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-w.writing }()
	r.mu.Lock()
	staged := m.staged
	m.staged = nil
	r.mu.Unlock()
	return r.writeConditions(ctx, node, staged)
}

// statusWriter returns the node's status writer, made on first use. Call with
// r.mu held.
func (r *Reconciler) statusWriter(m *nodeMemory) *statusWriter {
	if m.status == nil {
		m.status = &statusWriter{writing: make(chan struct{}, 1)}
	}
	return m.status
}

// dropStaged forgets the staged changes of a node that goes.
func (r *Reconciler) dropStaged(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.memory[uid]; m != nil {
		m.staged = nil
	}
}

// stopStatusTimer stops the node's timer, for a node forgotten. Call with
// r.mu held.
func stopStatusTimer(m *nodeMemory) {
	if m != nil && m.status != nil && m.status.timer != nil {
		m.status.timer.Stop()
		m.status.timer = nil
	}
}

// writeConditions writes staged changes in one strategic merge patch keyed by
// type, which leaves the kubelet's conditions alone. On failure the next
// pass stages them again: they are derived from the node, and the
// Terminating condition's record is dropped.
func (r *Reconciler) writeConditions(ctx context.Context, node *corev1.Node, staged *stagedConditions) error {
	if staged == nil || len(staged.set)+len(staged.remove) == 0 {
		return nil
	}
	entries := make([]any, 0, len(staged.set)+len(staged.remove))
	for _, c := range staged.set {
		entries = append(entries, c)
	}
	for _, t := range staged.remove {
		entries = append(entries, map[string]any{"$patch": "delete", "type": t})
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": entries}})
	if err == nil {
		err = r.Client.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch))
	}
	if client.IgnoreNotFound(err) != nil {
		r.mu.Lock()
		if m := r.memory[node.UID]; m != nil {
			m.condition = writtenCondition{}
		}
		r.mu.Unlock()
		return fmt.Errorf("writing the node's conditions: %w", err)
	}
	r.rememberWritten(node.UID, staged)
	return nil
}

// rememberWritten records the conditions a status write carried.
func (r *Reconciler) rememberWritten(uid types.UID, staged *stagedConditions) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.memory[uid]
	if m == nil {
		return // forgotten meanwhile: the node went
	}
	if m.written == nil {
		m.written = map[corev1.NodeConditionType]*corev1.NodeCondition{}
	}
	for _, c := range staged.set {
		m.written[c.Type] = &c
	}
	for _, t := range staged.remove {
		m.written[t] = nil
	}
}
