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

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
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
type drainSlots struct {
	mu      sync.Mutex
	held    map[types.UID]slotHolder
	waiting map[types.UID]slotHolder
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
	if s.held == nil {
		s.held, s.waiting = map[types.UID]slotHolder{}, map[types.UID]slotHolder{}
	}
	s.expire(h.asked)
	if _, ok := s.held[uid]; ok || limit <= 0 {
		s.held[uid] = h
		return true, 0
	}
	for other, w := range s.waiting {
		if other != uid && w.compare(h) < 0 {
			ahead++
		}
	}
	if ahead < limit-len(s.held) {
		delete(s.waiting, uid)
		s.held[uid] = h
		return true, 0
	}
	s.waiting[uid] = h
	return false, ahead
}

// give frees the node's slot, or its place in line, and names the waiting
// nodes that may now take the free slots, to be woken.
func (s *drainSlots) give(limit int, uid types.UID) (next []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, held := s.held[uid]
	delete(s.held, uid)
	delete(s.waiting, uid)
	if !held {
		return nil
	}
	return s.firstInLine(limit - len(s.held))
}

// expire drops the nodes that stopped asking (see slotExpiry).
func (s *drainSlots) expire(now time.Time) {
	for _, m := range []map[types.UID]slotHolder{s.held, s.waiting} {
		for uid, h := range m {
			if now.Sub(h.asked) > slotExpiry {
				delete(m, uid)
			}
		}
	}
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

// count says how many nodes hold a slot and how many wait.
func (s *drainSlots) count() (held, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held), len(s.waiting)
}

// waitForDrainSlot is the phase between the traffic cut and the drain: the
// node drains only once it holds one of the --max-concurrent-drains slots.
// A drained node needs none, nor one past its drain deadline (its pods are
// deleted then, whatever else waits).
func (r *Reconciler) waitForDrainSlot(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if _, done := node.Annotations[ngv1alpha1.DrainedAtAnnotation]; done {
		return reconcile.Result{}, nil
	}
	deadline, hasDeadline := r.drainDeadline(node)
	if hasDeadline && !r.Clock.Now().Before(deadline) {
		r.giveDrainSlot(ctx, node.UID)
		return reconcile.Result{}, nil
	}
	limit := r.Opts.MaxConcurrentNodes
	ok, ahead := r.slots.take(limit, node.UID, slotHolder{name: node.Name, since: terminationStarted(node), asked: r.Clock.Now()})
	if ok {
		return reconcile.Result{}, nil
	}
	// The condition's message stays the same while the line moves: a new
	// one would be written, and the node passed again, for each move.
	msg := fmt.Sprintf("waiting for a drain slot: %d nodes drain at once (--max-concurrent-drains); those whose termination began earlier go first", limit)
	r.waitFor(node.UID, "%s", msg)
	if r.once(node.UID, "drain-slot") {
		r.event(node, corev1.EventTypeNormal, ReasonWaitingForDrainSlot, "%s; %d nodes wait ahead of this one", msg, ahead)
	}
	// No queues yet: PDB changes must not wake a node that cannot evict.
	r.rememberQueues(node.Name, nil)
	next := slotWaitBackstop
	if r.wakeups == nil { // no controller to wake it: poll
		next = podsGonePoll
	}
	if hasDeadline {
		next = min(next, deadline.Sub(r.Clock.Now())+time.Millisecond)
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// giveDrainSlot frees the node's slot and wakes the nodes first in line.
func (r *Reconciler) giveDrainSlot(ctx context.Context, uid types.UID) {
	for _, name := range r.slots.give(r.Opts.MaxConcurrentNodes, uid) {
		if r.wakeups != nil {
			wakeNode(ctx, r.wakeups, name)
		}
	}
}
