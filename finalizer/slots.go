package finalizer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// slotWaitBackstop is how often a node waiting for a drain slot looks again:
// a slot given back wakes the nodes first in line at once.
const slotWaitBackstop = 30 * time.Second

// slotExpiry frees the slot, or the place in line, of a node that has not
// asked for it for this long. Every pass of a draining or waiting node asks
// (at least every slotWaitBackstop), so only a node whose passes stopped
// without a release is dropped: it must not hold other nodes back.
const slotExpiry = 3 * slotWaitBackstop

// drainSlots bounds the nodes that evict pods at once (--max-concurrent-drains).
// A node waits for a slot after its cordon and traffic cut, which are cheap
// and protective, and before its first eviction. Nodes get slots in the order
// their termination began, whatever order their passes come in.
//
// A node whose drain waits only on budgets (every pod left is in a PDB queue
// the PDB refuses, or waits on its own) steps aside: it gives its slot to the
// next node and takes one again, first in line, when it has pods to evict. A
// budget that stays spent for minutes (replacements that do not get Ready)
// must not stop every other node's drain.
type drainSlots struct {
	mu      sync.Mutex
	held    map[types.UID]slotHolder
	waiting map[types.UID]slotHolder
	// begun are the nodes that held a slot: their drain passes run without
	// one, and only their evictions wait for one.
	begun map[types.UID]bool
	// freed are when the free slots were handed off (a drained node's last
	// pod gone while others waited), oldest first; handoff is the one a
	// holder took, until its first eviction: nodeguard_drain_slot_handoff_seconds.
	freed   []time.Time
	handoff map[types.UID]time.Time
}

type slotHolder struct {
	name  string
	since time.Time // when its termination began: the order in line
	asked time.Time // its last pass
}

// compare orders the line: earlier terminations first, then by name.
func (h slotHolder) compare(o slotHolder) int {
	if c := h.since.Compare(o.since); c != 0 {
		return c
	}
	return cmp.Compare(h.name, o.name)
}

// take reports whether the node may drain: it holds a slot, or one is free
// and no node that began earlier waits for it. A node that may not waits in
// line; ahead counts the nodes before it.
func (s *drainSlots) take(limit int, uid types.UID, h slotHolder) (ok bool, ahead int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.report()
	if s.held == nil {
		s.held, s.waiting, s.begun = map[types.UID]slotHolder{}, map[types.UID]slotHolder{}, map[types.UID]bool{}
		s.handoff = map[types.UID]time.Time{}
	}
	s.expire(h.asked)
	if _, ok := s.held[uid]; ok || limit <= 0 {
		s.held[uid], s.begun[uid] = h, true
		return true, 0
	}
	for other, w := range s.waiting {
		if other != uid && w.compare(h) < 0 {
			ahead++
		}
	}
	if ahead < limit-len(s.held) {
		delete(s.waiting, uid)
		s.held[uid], s.begun[uid] = h, true
		if len(s.freed) > 0 {
			s.handoff[uid], s.freed = s.freed[0], s.freed[1:]
		}
		return true, 0
	}
	s.waiting[uid] = h
	return false, ahead
}

// give frees the node's slot, or its place in line, and names the waiting
// nodes that may now take the free slots, to be woken. A node that steps
// aside stays begun; one that is done is forgotten.
func (s *drainSlots) give(limit int, uid types.UID, done bool) (next []string) {
	return s.free(limit, uid, done, time.Time{})
}

// emptied frees the slot of a node whose last pod the drain waits for went
// at the moment at: a handoff, if nodes wait for the slot. The node stays
// begun: a pod that turns up later takes a slot again.
func (s *drainSlots) emptied(limit int, uid types.UID, at time.Time) (next []string) {
	return s.free(limit, uid, false, at)
}

// free gives the node's slot back; a handoff stamp (at, else the one the
// node took and did not use) goes with it to the next node in line.
func (s *drainSlots) free(limit int, uid types.UID, done bool, at time.Time) (next []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.report()
	_, held := s.held[uid]
	delete(s.held, uid)
	if done {
		delete(s.waiting, uid)
		delete(s.begun, uid)
	}
	if !held {
		return nil
	}
	if unused, ok := s.handoff[uid]; ok && at.IsZero() {
		at = unused
	}
	delete(s.handoff, uid)
	next = s.firstInLine(limit - len(s.held))
	if !at.IsZero() && len(next) > 0 {
		s.freed = append(s.freed, at)
		slices.SortFunc(s.freed, time.Time.Compare)
		// Never more stamps than free slots: a stamp nobody takes is stale.
		s.freed = s.freed[max(0, len(s.freed)-(limit-len(s.held))):]
	}
	return next
}

// report sets the gauge of slots held (s.mu held).
func (s *drainSlots) report() { slotsHeld.Set(float64(len(s.held))) }

// handedOff returns, once, when the slot the node holds was handed off to
// it: its first eviction ends the handoff.
func (s *drainSlots) handedOff(uid types.UID) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok = s.handoff[uid]
	delete(s.handoff, uid)
	return at, ok
}

// leaveLine takes a node that no longer waits for a slot out of the line,
// and names the nodes that may now take a free slot it stood before.
func (s *drainSlots) leaveLine(limit int, uid types.UID) (next []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, waiting := s.waiting[uid]; !waiting {
		return nil
	}
	delete(s.waiting, uid)
	return s.firstInLine(limit - len(s.held))
}

// holds reports whether the node holds a slot.
func (s *drainSlots) holds(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held[uid]
	return ok
}

// hasBegun reports whether the node held a slot since it began terminating.
func (s *drainSlots) hasBegun(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begun[uid]
}

// expire drops the nodes that stopped asking (see slotExpiry).
func (s *drainSlots) expire(now time.Time) {
	for _, m := range []map[types.UID]slotHolder{s.held, s.waiting} {
		for uid, h := range m {
			if now.Sub(h.asked) > slotExpiry {
				delete(m, uid)
				delete(s.handoff, uid)
			}
		}
	}
	s.freed = slices.DeleteFunc(s.freed, func(at time.Time) bool { return now.Sub(at) > slotExpiry })
}

// firstInLine names the first n waiting nodes.
func (s *drainSlots) firstInLine(n int) []string {
	if n <= 0 {
		return nil
	}
	line := make([]slotHolder, 0, len(s.waiting))
	for _, w := range s.waiting {
		line = append(line, w)
	}
	slices.SortFunc(line, slotHolder.compare)
	names := make([]string, 0, min(n, len(line)))
	for _, w := range line[:min(n, len(line))] {
		names = append(names, w.name)
	}
	return names
}

// line names the first n nodes waiting for a slot.
func (s *drainSlots) line(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstInLine(n)
}

// count says how many nodes hold a slot and how many wait.
func (s *drainSlots) count() (held, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held), len(s.waiting)
}

// waitForDrainSlot is the phase between the traffic cut and the drain: the
// node drains only once it holds one of the --max-concurrent-drains slots.
// A drained node needs none, nor one past its drain deadline (its pods are
// deleted then, whatever else waits), nor one that began draining (its
// evictions take a slot again in the drain pass).
func (r *Reconciler) waitForDrainSlot(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if _, done := r.drainEnded(node); done || r.slots.hasBegun(node.UID) {
		return reconcile.Result{}, nil
	}
	deadline, hasDeadline := r.drainDeadline(ctx, node)
	if hasDeadline && !r.Clock.Now().Before(deadline) {
		r.giveDrainSlot(ctx, node.UID)
		return reconcile.Result{}, nil
	}
	limit := r.Opts.MaxConcurrentNodes
	ok, ahead := r.takeSlot(node)
	if ok {
		return reconcile.Result{}, nil
	}
	if ahead < limit {
		// Next in line: watch its pods now, so that the pass a freed slot
		// wakes plans from a warm cache and evicts at once.
		r.pods.prepare(node.Name)
	}
	// The condition's message stays the same while the line moves: a new
	// one would be written, and the node passed again, for each move.
	msg := fmt.Sprintf("waiting for a drain slot: %d nodes drain at once (--max-concurrent-drains); those whose termination began earlier go first", limit)
	r.waitFor(node.UID, "%s", msg)
	r.progress(node.UID, "waited for a drain slot (%d nodes drain at once, --max-concurrent-drains)", limit)
	// No queues yet: PDB changes must not wake a node that cannot evict.
	r.rememberQueues(node.UID, nil)
	next := slotWaitBackstop
	if r.wakeups == nil { // no controller to wake it: poll
		next = podsGonePoll
	}
	return reconcile.Result{RequeueAfter: r.byDeadline(next, deadline, hasDeadline)}, nil
}

func (r *Reconciler) takeSlot(node *corev1.Node) (ok bool, ahead int) {
	return r.slots.take(r.Opts.MaxConcurrentNodes, node.UID, slotHolder{name: node.Name, since: terminationStarted(node), asked: r.Clock.Now()})
}

// giveDrainSlot frees the node's slot for good and wakes the nodes first in
// line.
func (r *Reconciler) giveDrainSlot(ctx context.Context, uid types.UID) {
	r.wakeInLine(ctx, r.slots.give(r.Opts.MaxConcurrentNodes, uid, true))
}

// podsGone is told by the node's pod watch that no pod the drain waits for
// is left: its slot goes to the next node in line at once, not after the
// node's own pass has listed its pods again and marked it drained. The
// node's own pass, which releases it, goes next after the slot's (ahead of
// other queued passes): in a fleet's deletion the queue holds the passes of
// nodes waiting for a slot, and an emptied node waited up to 6 s behind
// them for its release.
//
// A node that stepped aside (its last pods went by its PDB queues, without
// a slot) has no slot to give, and its release goes first all the same.
func (r *Reconciler) podsGone(ctx context.Context, name string) {
	for _, uid := range r.phases.uids(name) {
		held := r.slots.holds(uid)
		if !held && !r.slots.hasBegun(uid) {
			continue
		}
		r.Evictor.Forget(name) // its parked pods are gone
		if held {
			r.wakeInLine(ctx, r.slots.emptied(r.Opts.MaxConcurrentNodes, uid, r.Clock.Now()))
		}
		wakeNode(ctx, r.releaseWakeups, name)
	}
}

// observeHandoff records, at a node's first eviction in a slot handed off to
// it, how long the slot stood free.
func (r *Reconciler) observeHandoff(uid types.UID) {
	if at, ok := r.slots.handedOff(uid); ok {
		slotHandoff.Observe(r.Clock.Since(at).Seconds())
	}
}

// stepAside frees the slot of a node whose drain waits only on its PDBs; the
// node keeps its place in line for its next evictions.
func (r *Reconciler) stepAside(ctx context.Context, uid types.UID) {
	r.wakeInLine(ctx, r.slots.give(r.Opts.MaxConcurrentNodes, uid, false))
}

func (r *Reconciler) wakeInLine(ctx context.Context, names []string) {
	for _, name := range names {
		wakeNode(ctx, r.slotWakeups, name)
	}
	if len(names) > 0 {
		// The line moved: the nodes that take the next slots, not only
		// those woken now, keep their pods' cache warm (a waiting node has
		// no pass while the line moves).
		for _, name := range r.slots.line(2 * max(r.Opts.MaxConcurrentNodes, 1)) {
			r.pods.prepare(name)
		}
	}
}

// sendable reports whether a drain pass has pods it would evict now: pods
// under no PDB, or a PDB queue whose PDB's status allows a disruption and
// under which no other queue is evicting (it would go after that one).
func (r *Reconciler) sendable(plan *drain.Plan) bool {
	if len(plan.Unprotected) > 0 {
		return true
	}
	for _, g := range plan.Groups {
		if !g.Blocked && len(g.Pods) > 0 && !r.Evictor.Busy(g.UID) {
			return true
		}
	}
	return false
}

// waitsOnlyOnPDBs reports whether, after a pass, the node's drain waits on
// nothing of its own: no eviction went out, none failed, none of its pods is
// terminating. Its PDB queues wait on their budgets, or behind another
// node's eviction under the same PDB (deferred): those go one at a time per
// PDB across the fleet, with or without a slot, and a node holding its slot
// for its turn would hold the next node's drain for the PDB's whole queue.
func waitsOnlyOnPDBs(plan *drain.Plan, out drain.Outcome) bool {
	return out.Evicted == 0 && len(out.Errs) == 0 && len(plan.Terminating) == 0
}
