package drain

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Eviction results, as metric label values.
const (
	ResultEvicted      = "evicted"
	ResultBlocked      = "blocked_by_pdb"
	ResultMultiplePDBs = "multiple_pdbs"
	ResultGone         = "already_gone"
	// ResultThrottled is a 429 that is not a PDB's: the API server's priority
	// and fairness (or a proxy) shedding load. Retried like an error, never
	// parked for a PDB change that may not come.
	ResultThrottled = "throttled"
	ResultError     = "error"
	ResultDeleted   = "deleted_past_deadline"
)

// Evictor sends evictions. Use one Evictor per process: its per-PDB locks are
// what keeps at most one eviction in flight per PDB across all nodes draining.
type Evictor struct {
	Client client.Client
	// Parallel bounds concurrent evictions of pods under no PDB.
	Parallel int
	// Observe, if set, is called with the result of every eviction request.
	Observe func(result string)

	mu    sync.Mutex
	locks map[types.UID]*sync.Mutex
	// waiting are the parked PDB queues (queue.go); evicted the pods whose
	// eviction was answered 200, by node, and evictedControllers their
	// controllers.
	waiting            map[types.UID]parked
	evicted            map[string]map[types.UID]bool
	evictedControllers map[string]map[types.UID]bool
	// wakeSeq numbers the Wake calls; lastWake is the last of each PDB.
	wakeSeq  uint64
	lastWake map[types.UID]wake
	// grants are, per PDB and pod name, the evictions nodeguard was granted
	// and the statuses that showed them (charge, remember, Seen).
	grants map[types.UID]map[string]grant
	// deferred are the queues waiting for their PDB's lock (Evict), one per
	// node and PDB, whatever passes come meanwhile.
	deferred map[deferredKey]deferredQueue
}

type deferredKey struct {
	node string
	pdb  types.UID
}

// deferredQueue is a node's queue under a PDB another queue evicts under, as
// the node's latest pass planned it.
type deferredQueue struct {
	group    Group
	wakeMark uint64
}

// Outcome is what one pass of evictions did.
type Outcome struct {
	Evicted int
	// Deferred are the PDB queues that another queue under the same PDB
	// was evicting: they go once it is done, after the pass.
	Deferred int
	// Blocked are the PDBs that refused an eviction (429): their queues wait
	// for the PDB's status to change.
	Blocked []types.NamespacedName
	// MultiplePDBs are pods the API server refused because more than one PDB
	// selects them (500).
	MultiplePDBs []*corev1.Pod
	// Errs are other failures.
	Errs []error
}

// Evict runs one pass over the node's plan: each PDB queue serially until a
// 429, the disruptions its PDB allowed are spent, or its end; all queues and
// the unprotected pods concurrently. Blocked queues send nothing. A queue that
// stops short parks its remaining pods until its PDB allows a disruption
// (Wake). A queue whose PDB another queue is evicting under goes after it,
// and the pass does not wait for it (Outcome.Deferred).
func (e *Evictor) Evict(ctx context.Context, node string, plan *Plan) Outcome {
	var (
		t  tally
		wg sync.WaitGroup
	)
	queued := map[types.UID]bool{}
	for _, g := range plan.Groups {
		queued[g.UID] = true
		if g.Blocked {
			t.blocked(g.PDB)
			e.parkBlocked(ctx, node, g, plan.WakeMark)
			continue
		}
		wg.Go(func() { e.runQueue(ctx, node, g, plan.WakeMark, &t) })
	}
	e.unparkOthers(node, queued)
	e.evictUnprotected(ctx, node, plan.Unprotected, &t, &wg)
	wg.Wait()
	return t.out
}

// tally gathers a pass's Outcome from its concurrent evictions.
type tally struct {
	mu  sync.Mutex
	out Outcome
}

// record counts one eviction's result (pdb nil: an unprotected pod), and
// says whether the PDB's queue stops there.
func (t *tally) record(pod *corev1.Pod, pdb *types.NamespacedName, err error) (stop bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch result := classify(err); result {
	case ResultEvicted, ResultGone:
		t.out.Evicted++
	case ResultBlocked:
		if pdb != nil {
			t.out.Blocked = append(t.out.Blocked, *pdb)
		}
		return true
	case ResultMultiplePDBs:
		t.out.MultiplePDBs = append(t.out.MultiplePDBs, pod)
	default:
		t.out.Errs = append(t.out.Errs, fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err))
		return pdb != nil // keep a PDB queue in order: retry next pass
	}
	return false
}

func (t *tally) blocked(pdb types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out.Blocked = append(t.out.Blocked, pdb)
}

func (t *tally) deferred() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out.Deferred++
}

// parkBlocked parks the queue of a PDB that allows nothing now.
func (e *Evictor) parkBlocked(ctx context.Context, node string, g Group, wakeMark uint64) {
	if g.ByDesign {
		// No status change will free it: replacement first (or a new spec
		// and the pass it wakes) does, never a wake-up that could evict a
		// pod a rollout is about to replace.
		e.park(g.UID, node, nil)
		return
	}
	e.parkAfter(ctx, g.UID, node, g.Pods, wakeMark)
}

// runQueue evicts one PDB's queue of the node under the PDB's lock.
func (e *Evictor) runQueue(ctx context.Context, node string, g Group, wakeMark uint64, t *tally) {
	lock := e.lockFor(g.UID)
	if !lock.TryLock() {
		// Another queue evicts under this PDB (another node's pass, or
		// parked queues woken by its status): this queue goes once it is
		// done, without the pass. A pass that waited would hold its node's
		// next pass, and so its release once its pods are gone, for as long
		// as other nodes' evictions take.
		t.deferred()
		if e.deferQueue(node, g, wakeMark) {
			go e.runDeferred(ctx, node, g.UID, lock)
		}
		return
	}
	defer lock.Unlock()
	e.evictQueue(ctx, node, g, wakeMark, func(pod *corev1.Pod, err error) bool { return t.record(pod, &g.PDB, err) })
}

// evictUnprotected evicts the pods no PDB protects, e.Parallel at a time.
func (e *Evictor) evictUnprotected(ctx context.Context, node string, pods []*corev1.Pod, t *tally, wg *sync.WaitGroup) {
	sem := make(chan struct{}, max(e.Parallel, 1))
	for _, pod := range pods {
		if e.wasEvicted(node, pod.UID) {
			// Granted in an earlier pass whose going the plan's pods do
			// not show yet: terminating, not sent again.
			t.record(pod, nil, nil)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			t.record(pod, nil, e.evictOnce(ctx, node, pod))
		}()
	}
}

// deferQueue leaves the node's queue for its PDB's lock, and reports whether
// none was waiting: one goroutine per node and PDB waits, and takes the
// latest pass's plan of the queue. A PDB with a long queue wakes every node
// with a pod under it at each status, and a goroutine per pass would pile up.
func (e *Evictor) deferQueue(node string, g Group, wakeMark uint64) (first bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.deferred == nil {
		e.deferred = map[deferredKey]deferredQueue{}
	}
	key := deferredKey{node, g.UID}
	_, waiting := e.deferred[key]
	e.deferred[key] = deferredQueue{group: g, wakeMark: wakeMark}
	return !waiting
}

// runDeferred waits for the PDB's lock, then evicts the node's deferred
// queue, unless its node was forgotten meanwhile (Forget drops it: its pods
// are gone, or a new pass plans anew).
func (e *Evictor) runDeferred(ctx context.Context, node string, pdb types.UID, lock *sync.Mutex) {
	lock.Lock()
	defer lock.Unlock()
	e.mu.Lock()
	key := deferredKey{node, pdb}
	q, ok := e.deferred[key]
	delete(e.deferred, key)
	e.mu.Unlock()
	if !ok {
		return
	}
	// The time bound starts with the lock: the wait for it may be long.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	e.evictQueue(ctx, node, q.group, q.wakeMark, stopsQueue)
}

// evictQueue evicts the queue's pods one at a time, under its PDB's lock,
// while the budget allows and stop (told each answer) does not say stop;
// the rest park until the PDB's status changes (Wake). wakeMark is the plan's
// Plan.WakeMark.
func (e *Evictor) evictQueue(ctx context.Context, node string, g Group, wakeMark uint64, stop func(*corev1.Pod, error) bool) {
	b := e.charge(g.UID, budgetOf(&g))
	for i, pod := range g.Pods {
		if e.wasEvicted(node, pod.UID) {
			continue
		}
		if !b.allows(pod) { // spent: the PDB's next status goes on
			e.parkAfter(ctx, g.UID, node, g.Pods[i:], wakeMark)
			return
		}
		mark := e.Mark()
		err := e.evictOnce(ctx, node, pod)
		if err == nil && b.spend(pod) {
			e.remember(g.UID, pod)
		}
		if ctx.Err() != nil || stop(pod, err) {
			e.parkAfter(ctx, g.UID, node, g.Pods[i:], mark)
			return
		}
	}
	e.park(g.UID, node, nil)
}

// stopsQueue is a deferred queue's stop: as a pass's, every answer but a
// grant (or the pod gone, or more than one PDB) stops it, with no outcome to
// record; the node's next pass reports what it meets.
func stopsQueue(_ *corev1.Pod, err error) bool {
	switch classify(err) {
	case ResultEvicted, ResultGone, ResultMultiplePDBs:
		return false
	}
	return true
}

// evict sends one eviction, for exactly this pod (UID precondition: never a
// replacement with the same name).
func (e *Evictor) evict(ctx context.Context, pod *corev1.Pod) error {
	eviction := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	err := e.Client.SubResource("eviction").Create(ctx, pod, eviction)
	if e.Observe != nil {
		e.Observe(classify(err))
	}
	return err
}

// multiplePDBsMessage is in the Eviction API's 500 answer for a pod that more
// than one PDB selects; any other 500 is an ordinary server error.
const multiplePDBsMessage = "more than one PodDisruptionBudget"

// classify maps an Eviction API answer to a result: 200 evicted, 429 with the
// cause DisruptionBudget blocked by a PDB, any other 429 throttled, 500 saying
// "more than one PodDisruptionBudget" (only that one), 404/409 (UID changed)
// gone; everything else is an error, retried.
func classify(err error) string {
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return ResultEvicted
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return ResultGone
	case apierrors.IsTooManyRequests(err) && apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause):
		return ResultBlocked
	case apierrors.IsTooManyRequests(err):
		return ResultThrottled
	case errors.As(err, &status) && status.Status().Code == http.StatusInternalServerError &&
		strings.Contains(status.Status().Message, multiplePDBsMessage):
		return ResultMultiplePDBs
	default:
		return ResultError
	}
}

func (e *Evictor) lockFor(uid types.UID) *sync.Mutex {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.locks == nil {
		e.locks = map[types.UID]*sync.Mutex{}
	}
	l, ok := e.locks[uid]
	if !ok {
		l = &sync.Mutex{}
		e.locks[uid] = l
	}
	return l
}

// Busy reports whether a queue under the PDB is evicting now (its lock is
// held): another queue under it would go after that one, not now.
func (e *Evictor) Busy(pdb types.UID) bool {
	lock := e.lockFor(pdb)
	if lock.TryLock() {
		lock.Unlock()
		return false
	}
	return true
}

// Delete deletes pods outright, bypassing PDBs: the drain deadline's policy.
func (e *Evictor) Delete(ctx context.Context, pods []*corev1.Pod) error {
	var errs []error
	for _, pod := range pods {
		err := e.Client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
		if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err))
			continue
		}
		if e.Observe != nil {
			e.Observe(ResultDeleted)
		}
	}
	return errors.Join(errs...)
}
