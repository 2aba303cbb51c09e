package drain

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
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

// Forget drops what the Evictor keeps for the node's pods: its parked and
// deferred queues and the pods it evicted. It keeps the controllers it evicted from, which
// tell their replacements from originals until the node is gone (ForgetNode).
func (e *Evictor) Forget(node string) {
	e.unparkOthers(node, nil)
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.evicted, node)
	for key := range e.deferred {
		if key.node == node {
			delete(e.deferred, key) // its pods are gone, or a new pass plans anew
		}
	}
}

// ForgetNode drops everything the Evictor keeps for a node that is gone.
func (e *Evictor) ForgetNode(node string) {
	e.Forget(node)
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.evictedControllers, node)
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
	status := statusBudget(pdb)
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
// disruptions the status allowed, less nodeguard's own grants it does not
// show yet, each Ready pod evicted spending one. A pod not Ready is always
// tried (the Eviction API may let it go at 0); with no status computed for
// the PDB's current spec, nothing is counted. A queue that spent it parks
// without a request that could only be refused (429).
type budget struct {
	left    int32
	limited bool
	// version and disrupted are the resourceVersion and DisruptedPods of the
	// PDB the status was read from.
	version   string
	disrupted map[string]metav1.Time
}

func (b *budget) allows(pod *corev1.Pod) bool { return !b.limited || !PodReady(pod) || b.left > 0 }

// spend takes one of the status's disruptions for an evicted pod, if it was
// Ready, and reports whether it did.
func (b *budget) spend(pod *corev1.Pod) bool {
	if PodReady(pod) {
		b.left--
		return true
	}
	return false
}

// budgetOf is the budget of a planned queue, from the PDB as the plan read it.
func budgetOf(g *Group) budget {
	if g.Budget == nil {
		return budget{left: g.Allowed}
	}
	b := statusBudget(g.Budget)
	b.left, b.limited = g.Allowed, g.Budget.Status.ObservedGeneration >= g.Budget.Generation
	return b
}

// statusBudget is the budget the PDB's status allows.
func statusBudget(pdb *policyv1.PodDisruptionBudget) budget {
	return budget{left: pdb.Status.DisruptionsAllowed, limited: true, version: pdb.ResourceVersion, disrupted: pdb.Status.DisruptedPods}
}

// grantBackstop bounds how long an eviction granted by the API server is
// taken off statuses that do not show it. The eviction's own write of the PDB
// lists the pod in DisruptedPods and allows one disruption fewer; a status
// read before that write arrived (a cache that lags, or the disruption
// controller's write in between, with a newer resourceVersion) would allow
// the same disruption twice, and the second request could only be refused
// (429). The bound only matters when no status ever shows the grant (the API
// server let a pod it saw not Ready go without charging the PDB).
const grantBackstop = 30 * time.Second

// grant is one pod's eviction under a PDB, as nodeguard granted it or a
// status showed it.
type grant struct {
	// at is when the API server granted it (zero: not nodeguard's, or not yet).
	at time.Time
	// shownIn is the first resourceVersion of the PDB whose DisruptedPods
	// listed the pod: that status and every later one count the grant (the
	// disruption controller drops the pod from DisruptedPods only once it
	// sees it deleting, and then no longer counts it healthy).
	shownIn string
	// seen is when shownIn was recorded.
	seen time.Time
}

// Seen records which pods the PDB's status shows as disrupted. The PDB watch
// hands over every status in order: a grant shown once stays counted in later
// statuses that no longer list it.
func (e *Evictor) Seen(pdb *policyv1.PodDisruptionBudget) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seenLocked(pdb.UID, pdb.ResourceVersion, pdb.Status.DisruptedPods)
}

func (e *Evictor) seenLocked(pdb types.UID, version string, disrupted map[string]metav1.Time) {
	if len(disrupted) == 0 || version == "" {
		return
	}
	if e.grants == nil {
		e.grants = map[types.UID]map[string]grant{}
	}
	if e.grants[pdb] == nil {
		e.grants[pdb] = map[string]grant{}
	}
	e.prune(e.grants[pdb], time.Now())
	for pod := range disrupted {
		g := e.grants[pdb][pod]
		if g.shownIn == "" || olderVersion(version, g.shownIn) {
			g.shownIn, g.seen = version, time.Now()
			e.grants[pdb][pod] = g
		}
	}
}

// charge takes nodeguard's grants under the PDB that the status b was read
// from does not show off its budget: another node's queue, or a wake-up, may
// have spent them.
func (e *Evictor) charge(pdb types.UID, b budget) budget {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seenLocked(pdb, b.version, b.disrupted)
	if !b.limited {
		return b
	}
	now := time.Now()
	for pod, g := range e.grants[pdb] {
		if !g.at.IsZero() && now.Sub(g.at) < grantBackstop && !shows(b, pod, g) {
			b.left--
		}
	}
	return b
}

// shows reports whether the status counts the grant of the pod: it lists the
// pod, or it is no older than a status that did.
func shows(b budget, pod string, g grant) bool {
	if _, ok := b.disrupted[pod]; ok {
		return true
	}
	return g.shownIn != "" && b.version != "" && !olderVersion(b.version, g.shownIn)
}

// olderVersion reports whether resourceVersion a of a PDB is older than b; a
// version that is not a number (never from kube-apiserver) is never older.
func olderVersion(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

// remember records that the API server granted the eviction of a Ready pod
// under the PDB, and forgets grants past grantBackstop.
func (e *Evictor) remember(pdb types.UID, pod *corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if e.grants == nil {
		e.grants = map[types.UID]map[string]grant{}
	}
	for uid, pods := range e.grants {
		if e.prune(pods, now); len(pods) == 0 {
			delete(e.grants, uid)
		}
	}
	if e.grants[pdb] == nil {
		e.grants[pdb] = map[string]grant{}
	}
	g := e.grants[pdb][pod.Name]
	g.at = now
	e.grants[pdb][pod.Name] = g
}

// prune forgets the grants and shown disruptions of one PDB older than
// grantBackstop.
func (e *Evictor) prune(pods map[string]grant, now time.Time) {
	for name, g := range pods {
		if now.Sub(g.at) >= grantBackstop && now.Sub(g.seen) >= grantBackstop {
			delete(pods, name)
		}
	}
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
					e.remember(pdb, pods[i])
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

// EvictedControllers are the controllers of the pods whose eviction from the
// node was answered 200: a pod of theirs that comes back in the second of the
// node's deletion is a replacement (PlanOptions.EvictedControllers).
func (e *Evictor) EvictedControllers(node string) map[types.UID]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.evictedControllers[node])
}

// evictOnce sends the eviction and remembers a 200, so that a drain pass
// whose list predates it does not send it again.
func (e *Evictor) evictOnce(ctx context.Context, node string, pod *corev1.Pod) error {
	err := e.evict(ctx, pod)
	if err == nil {
		e.mu.Lock()
		e.evicted = addUID(e.evicted, node, pod.UID)
		if owner := metav1.GetControllerOf(pod); owner != nil {
			e.evictedControllers = addUID(e.evictedControllers, node, owner.UID)
		}
		e.mu.Unlock()
	}
	return err
}

// addUID adds uid to the node's set in m, making what is missing.
func addUID(m map[string]map[types.UID]bool, node string, uid types.UID) map[string]map[types.UID]bool {
	if m == nil {
		m = map[string]map[types.UID]bool{}
	}
	if m[node] == nil {
		m[node] = map[types.UID]bool{}
	}
	m[node][uid] = true
	return m
}
