package drain

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A PDB queue that a 429 (or a PDB allowing no disruption) stopped parks its
// remaining pods here, by PDB and node. When the PDB's status changes to allow
// a disruption, Wake sends the next evictions at once, from the pods of the
// last drain pass, without waiting for a new pass to list them: the wake-up
// path is one eviction request long. The drain pass that follows re-derives
// everything from the cluster, as always.

// parked are the pods of one PDB queue waiting for the PDB, by node.
type parked map[string][]*corev1.Pod

// park records the pods of the node's queue under the PDB that wait for it to
// allow a disruption; no pods clears the entry.
func (e *Evictor) park(pdb types.UID, node string, pods []*corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(pods) == 0 {
		delete(e.waiting[pdb], node)
		if len(e.waiting[pdb]) == 0 {
			delete(e.waiting, pdb)
		}
		return
	}
	if e.waiting == nil {
		e.waiting = map[types.UID]parked{}
	}
	if e.waiting[pdb] == nil {
		e.waiting[pdb] = parked{}
	}
	e.waiting[pdb][node] = slices.Clone(pods)
}

// unparkOthers clears the node's parked queues under PDBs other than keep:
// what a new pass no longer plans to evict no longer waits.
func (e *Evictor) unparkOthers(node string, keep map[types.UID]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for pdb, nodes := range e.waiting {
		if !keep[pdb] {
			delete(nodes, node)
			if len(nodes) == 0 {
				delete(e.waiting, pdb)
			}
		}
	}
}

// take removes and returns the queues parked under the PDB.
func (e *Evictor) take(pdb types.UID) parked {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.waiting[pdb]
	delete(e.waiting, pdb)
	return p
}

// Waiting reports whether some node's queue waits for the PDB.
func (e *Evictor) Waiting(pdb types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.waiting[pdb]) > 0
}

// Forget drops what the Evictor keeps for the node: its parked queues and the
// pods it evicted.
func (e *Evictor) Forget(node string) {
	e.unparkOthers(node, nil)
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.evicted, node)
}

// wakeTimeout bounds the evictions one Wake sends.
const wakeTimeout = time.Minute

// Wake is told that the PDB's status now allows disruptions (allowed). If queues are
// parked under it, it sends their next evictions in the background, serially
// as always, and returns true; sending is called just before its first
// eviction request, if it sends one. The evictions outlive ctx (an event
// handler's, which ends when it returns), up to wakeTimeout: an eviction cut
// off half-way can leave its PDB charged for minutes.
func (e *Evictor) Wake(ctx context.Context, pdb *policyv1.PodDisruptionBudget, sending func()) bool {
	if sending != nil {
		sending = sync.OnceFunc(sending) // one status change, one wake-up: whichever run sends first
	}
	status := budget{left: pdb.Status.DisruptionsAllowed, limited: true, version: pdb.ResourceVersion}
	e.mu.Lock()
	if e.lastWake == nil {
		e.lastWake = map[types.UID]wake{}
	}
	e.wakeSeq++
	e.lastWake[pdb.UID] = wake{seq: e.wakeSeq, status: status, sending: sending}
	waiting := len(e.waiting[pdb.UID]) > 0
	e.mu.Unlock()
	if !waiting {
		return false
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
		defer cancel()
		e.runParked(ctx, pdb.UID, status, sending)
	}()
	return true
}

// Mark numbers the Wake calls so far: take it before reading the PDBs a plan
// is made of (Plan.WakeMark).
func (e *Evictor) Mark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wakeSeq
}

// parkAfter parks a queue that stopped short. If the PDB's status allowed a
// disruption since mark (a Wake that found nothing parked yet, while this
// queue's eviction was in flight or its plan was made), the queue goes on at
// once instead of missing it.
func (e *Evictor) parkAfter(ctx context.Context, pdb types.UID, node string, pods []*corev1.Pod, mark uint64) {
	e.park(pdb, node, pods)
	e.mu.Lock()
	last := e.lastWake[pdb]
	e.mu.Unlock()
	if len(pods) > 0 && last.seq > mark {
		go e.runParked(ctx, pdb, last.status, last.sending)
	}
}

// wake is the last Wake of a PDB: its number, the budget of its status and
// its sending callback.
type wake struct {
	seq     uint64
	status  budget
	sending func()
}

// budget is what a queue may still send before its PDB's next status: the
// disruptions the status allowed, each Ready pod evicted spending one. A pod
// not Ready is always tried (the Eviction API may let it go at 0); with no
// status computed for the PDB's current spec, nothing is counted. A queue
// that spent it parks without a request that could only be refused (429).
type budget struct {
	left    int32
	limited bool
	// version is the resourceVersion of the PDB the status was read from.
	version string
}

func (b *budget) allows(pod *corev1.Pod) bool { return !b.limited || !podReady(pod) || b.left > 0 }

// spend takes one of the status's disruptions for an evicted pod, if it was
// Ready, and reports whether it did.
func (b *budget) spend(pod *corev1.Pod) bool {
	if podReady(pod) {
		b.left--
		return true
	}
	return false
}

// budgetOf is the budget of a planned queue, from the PDB as the plan read it.
func budgetOf(g *Group) budget {
	b := budget{left: g.Allowed, limited: g.Budget != nil && g.Budget.Status.ObservedGeneration >= g.Budget.Generation}
	if g.Budget != nil {
		b.version = g.Budget.ResourceVersion
	}
	return b
}

// grantMemory is how long an eviction granted under a PDB's status is taken
// off that status's budget. The eviction's own write of the PDB (one fewer
// disruption allowed) replaces the status within milliseconds; a PDB cache
// that has not shown it yet would otherwise allow the same disruption twice,
// and the second request could only be refused (429). Bounded, so that an
// echo the cache missed never holds a queue.
const grantMemory = 5 * time.Second

// granted counts the evictions granted under one status of a PDB.
type granted struct {
	version string
	n       int32
	last    time.Time
}

// charge takes the disruptions granted since the status b was read from off
// its budget: another node's queue, or a wake-up, may have spent them.
func (e *Evictor) charge(pdb types.UID, b budget) budget {
	e.mu.Lock()
	defer e.mu.Unlock()
	if g, ok := e.grants[pdb]; ok && b.limited && g.version == b.version && time.Since(g.last) < grantMemory {
		b.left -= g.n
	}
	return b
}

// remember records a granted eviction that spent a disruption of the status b
// was read from.
func (e *Evictor) remember(pdb types.UID, b budget) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if e.grants == nil {
		e.grants = map[types.UID]granted{}
	}
	for uid, g := range e.grants {
		if now.Sub(g.last) >= grantMemory {
			delete(e.grants, uid)
		}
	}
	g := e.grants[pdb]
	if g.version != b.version {
		g = granted{version: b.version}
	}
	g.n++
	g.last = now
	e.grants[pdb] = g
}

// runParked evicts the parked pods of the PDB, node by node in name order,
// until a 429 parks the rest again. The pods' going wakes their nodes' drain
// passes (the pod watches).
func (e *Evictor) runParked(ctx context.Context, pdb types.UID, b budget, sending func()) {
	lock := e.lockFor(pdb)
	lock.Lock()
	defer lock.Unlock()
	b = e.charge(pdb, b)
	queues := e.take(pdb) // under the PDB's lock: a pass parking meanwhile waits for it
	nodes := make([]string, 0, len(queues))
	for node := range queues {
		nodes = append(nodes, node)
	}
	slices.Sort(nodes)
	first, blocked := true, false
	for _, node := range nodes {
		pods := queues[node]
		for i := 0; i < len(pods) && !blocked; i++ {
			if e.wasEvicted(node, pods[i].UID) {
				continue
			}
			if ctx.Err() != nil || !b.allows(pods[i]) {
				blocked = true
				break
			}
			if first {
				first = false
				if sending != nil {
					sending()
				}
			}
			switch err := e.evictOnce(ctx, node, pods[i]); classify(err) {
			case ResultEvicted:
				if b.spend(pods[i]) {
					e.remember(pdb, b)
				}
				pods[i] = nil
			case ResultGone, ResultMultiplePDBs:
				pods[i] = nil
			default: // 429, or an error: keep the order, wait for the next change
				blocked = true
			}
		}
		e.park(pdb, node, slices.DeleteFunc(pods, func(p *corev1.Pod) bool { return p == nil }))
	}
}

// wasEvicted reports whether an eviction of the pod was answered 200 already.
func (e *Evictor) wasEvicted(node string, uid types.UID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.evicted[node][uid]
}

// evictOnce sends the eviction and remembers a 200, so that a drain pass
// whose list predates it does not send it again.
func (e *Evictor) evictOnce(ctx context.Context, node string, pod *corev1.Pod) error {
	err := e.evict(ctx, pod)
	if err == nil {
		e.mu.Lock()
		if e.evicted == nil {
			e.evicted = map[string]map[types.UID]bool{}
		}
		if e.evicted[node] == nil {
			e.evicted[node] = map[types.UID]bool{}
		}
		e.evicted[node][pod.UID] = true
		e.mu.Unlock()
	}
	return err
}
