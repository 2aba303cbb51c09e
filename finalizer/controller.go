// Package finalizer is the termination controller: it takes a node that was
// admitted for deletion (deletion timestamp plus the nodeguard.io/termination
// finalizer), holds its maintenance Lease, cordons and taints it, cuts its
// load-balancer traffic, drains its pods serially per PodDisruptionBudget
// (package drain), optionally waits for its volumes to detach, and only then
// removes the finalizer, which releases the node.
//
// Every phase is re-derived from the cluster on each pass, so a restart at any
// point resumes where the work stands.
package finalizer

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/internal/requeue"
)

// Defaults of the termination options.
const (
	DefaultAdminStateTimeout   = 30 * time.Second
	DefaultVolumeDetachTimeout = time.Minute
	DefaultMaxConcurrentNodes  = 10
	// DefaultParallelEvictions sends a typical node's unprotected pods in
	// one wave, as kubectl drain does: under a fleet's drain each eviction
	// round trip is slow, and a second wave doubles the drain.
	DefaultParallelEvictions = 50
	// DefaultDrainBackstop is how long a drain whose pods and PDBs are
	// watched waits without news before it looks again: for what only time
	// changes (a pod stuck past its grace period, an unreachable node's
	// margin), and a 429 that no PDB change will follow.
	DefaultDrainBackstop = 5 * time.Second
)

// Waiting intervals. The node's pods (a watch per draining node), PDB status
// changes, VolumeAttachments and node changes trigger passes at once; these
// are backstops.
const (
	// podsGonePoll paces the drain of a node whose pods are not watched (a
	// Reconciler run without SetupWithManager).
	podsGonePoll = 500 * time.Millisecond
	// blockedBackstopMax caps the backstop after a 429; kubectl drain waits 5 s.
	blockedBackstopMax = 4 * time.Second
	// trafficWakeBackstop paces a node whose traffic cut will wake it.
	trafficWakeBackstop = 5 * time.Second
	// holdPoll paces a node whose maintenance Lease someone else holds.
	holdPoll = 15 * time.Second
)

// AdminState is what the controller needs of the Azure admin-state manager.
type AdminState interface {
	SetDesired(node *corev1.Node, state azure.AdminState)
	WaitConfirmed(ctx context.Context, uid types.UID, state azure.AdminState) error
	// NothingCut says whether the confirmed Down cut nothing: the node is in
	// no backend pool.
	NothingCut(uid types.UID) bool
}

// DefaultStuckPodMargin is Karpenter's rule for a pod stuck terminating.
const DefaultStuckPodMargin = time.Minute

// Options configure termination.
type Options struct {
	// Identity names this replica in maintenance Leases (nodeguard/<identity>).
	Identity string
	// AdminStateTimeout bounds the wait for Azure to confirm Down.
	AdminStateTimeout time.Duration
	// TrafficCutFailure is what the drain does when the traffic cut failed or
	// was not confirmed within AdminStateTimeout (empty: drain).
	TrafficCutFailure TrafficCutFailurePolicy
	// CutoverPause waits after traffic is cut, for in-flight requests.
	CutoverPause time.Duration
	// DaemonSets is what happens to DaemonSet pods.
	DaemonSets drain.DaemonSetPolicy
	// DrainTimeout, if positive, is the drain deadline counted from deletion;
	// the node annotation nodeguard.io/drain-timeout overrides it. Past it the
	// remaining pods are deleted without regard to PDBs or do-not-evict.
	DrainTimeout time.Duration
	// StuckPodMargin is how long past its grace period a terminating pod is
	// waited for; then it no longer holds the node (0: forever).
	StuckPodMargin time.Duration
	// VolumeDetachTimeout bounds the wait for VolumeAttachments; 0 skips it.
	VolumeDetachTimeout time.Duration
	// MaxConcurrentNodes bounds the nodes that drain at once (drainSlots);
	// 0 leaves drains unbounded.
	MaxConcurrentNodes int
	// BlockedPDBPolicy is what a drain does about pods under a PDB blocked by
	// design (empty: replace); annotations on a Deployment or PDB override it.
	BlockedPDBPolicy drain.BlockedPDBPolicy
	// BlockedPDBSettle is how long a queue must stay blocked by design before
	// nodeguard acts on it.
	BlockedPDBSettle time.Duration
	// ReplacementTimeout is how long a restart's new pod may stay not Ready
	// before the replacement counts as stalled and the drain falls back to
	// waiting (0: never).
	ReplacementTimeout time.Duration
	// DrainBackstop overrides DefaultDrainBackstop.
	DrainBackstop time.Duration
}

// Reconciler terminates nodes.
type Reconciler struct {
	// Client reads cached nodes, PDBs and VolumeAttachments, and writes.
	Client client.Client
	// Reader reads fresh from the API server: pods by node (never cached),
	// Leases.
	Reader   client.Reader
	Evictor  *drain.Evictor
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// AdminState is nil when Azure is not configured.
	AdminState AdminState
	// Instances, when set (Azure), says whether a NotReady node's VM is gone.
	Instances InstanceChecker
	Opts      Options

	phases phases
	slots  drainSlots
	repl   replacements
	// pods watches the pods of the nodes being drained (nil: they are polled).
	pods *nodePods
	// wakeups asks for passes of nodes whose wait ended (pods, traffic cut);
	// slotWakeups for those of nodes that may take a drain slot, first;
	// releaseWakeups for those of emptied nodes, after those.
	wakeups, slotWakeups, releaseWakeups chan event.GenericEvent
	// mu guards what follows. reported, waiting and backoff remember what
	// was already said, so that a waiting drain does not repeat itself: the
	// keys reported once per node (once), and each node's last waiting
	// message and backstop.
	mu       sync.Mutex
	reported map[types.UID]map[string]bool
	waiting  map[types.UID]writtenMessage
	backoff  map[types.UID]time.Duration
	// queues are the PDBs of each draining node's eviction queues, by node
	// name: a PDB change wakes only the nodes waiting on that PDB.
	queues map[string]map[types.UID]bool
	// waitingFor is what each node's current phase waits for, and conditions
	// the node condition last written, for reportCondition.
	waitingFor map[types.UID]string
	conditions map[types.UID]writtenCondition
	// drainedAt is when each node's drain ended (recordDrained).
	drainedAt map[types.UID]time.Time
	// cutWaits are the nodes a background wait for the traffic cut wakes.
	cutWaits map[types.UID]bool
	// staged are the condition changes of each node's running pass.
	staged map[types.UID]*stagedConditions
	// leadingSince is when this process started leading: a drain that began
	// later is its own, and r.repl knows every restart made for it.
	leadingSince time.Time
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch;delete
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list;watch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattachments,verbs=list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update,namespace=kube-node-maintenance

// SetupWithManager registers the controller. It sees nodes being deleted with
// the finalizer; the pods of each node being drained (a watch of its own), the
// PDB status changes its queues wait on and its VolumeAttachments wake it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	r.wakeups = make(chan event.GenericEvent, 1024)
	r.slotWakeups = make(chan event.GenericEvent, 1024)
	r.releaseWakeups = make(chan event.GenericEvent, 1024)
	r.pods = newNodePods(cs, r.wakeups)
	r.pods.emptied = r.podsGone
	if err := mgr.Add(r.pods); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(r.startLeading)); err != nil { // needs leader election
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("termination").
		For(&corev1.Node{}, builder.WithPredicates(terminatingNodeChanged())).
		Watches(&policyv1.PodDisruptionBudget{}, r.pdbHandler()).
		WatchesRawSource(source.Channel(r.wakeups, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Channel(r.slotWakeups, enqueueAt(slotWakePriority))).
		WatchesRawSource(source.Channel(r.releaseWakeups, enqueueAt(releaseWakePriority))).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.workers()})
	if r.Opts.VolumeDetachTimeout > 0 {
		// A cache of VolumeAttachments (few and small), not a list per pass.
		b = b.Watches(&storagev1.VolumeAttachment{}, handler.EnqueueRequestsFromMapFunc(r.attachedNode))
	}
	return b.Complete(r)
}

// slotWakePriority puts the pass of a node that may take a drain slot ahead
// of every pass waiting for a worker (controller-runtime's priority queue;
// events default to 0, the initial list to handler.LowPriority): a freed slot
// is the fleet's bottleneck, and the passes queued before it (a hundred
// admitted nodes' cordons and waits) must not keep it idle.
// releaseWakePriority puts the pass that releases an emptied node after
// those, and ahead of the rest: a queued pass raised to a priority keeps its
// place among equals, so at slotWakePriority the release (its pod events
// already queued it) went ahead of the slot's next node.
const (
	slotWakePriority    = 100
	releaseWakePriority = 50
)

// enqueueAt enqueues the woken nodes at the priority.
func enqueueAt(priority int) handler.EventHandler {
	return handler.Funcs{GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Name: e.Object.GetName()}}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(priority)}, req)
			return
		}
		q.Add(req)
	}}
}

// workers is how many passes run at once: a draining node's pass waits for
// its evictions, so the nodes holding drain slots may take as many workers,
// and as many again serve every other pass (a new node's Lease, cordon and
// traffic cut, a release): otherwise the drains hold every worker while
// admitted nodes wait to be cordoned.
func (r *Reconciler) workers() int {
	return 2 * max(r.Opts.MaxConcurrentNodes, 1)
}

// pdbHandler wakes what waits on a PDB, and shows the Evictor every status
// (drain.Evictor.Seen). A status change that allows a
// disruption sends the next evictions of the queues parked under it at once
// (drain.Evictor.Wake); the pods' going then wakes their nodes. Any other
// change wakes the nodes whose queues include the PDB, except a change that
// only charged it (fewer disruptions allowed: an eviction's own mark).
func (r *Reconciler) pdbHandler() handler.EventHandler {
	enqueue := func(ctx context.Context, pdb client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range r.terminatingNodes(ctx, pdb) {
			q.Add(req)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if pdb, ok := e.Object.(*policyv1.PodDisruptionBudget); ok {
				r.Evictor.Seen(pdb)
			}
			enqueue(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			old, ok1 := e.ObjectOld.(*policyv1.PodDisruptionBudget)
			pdb, ok2 := e.ObjectNew.(*policyv1.PodDisruptionBudget)
			if ok2 {
				// Every status, in order: which of nodeguard's grants it shows.
				r.Evictor.Seen(pdb)
			}
			switch {
			case !ok1 || !ok2:
				enqueue(ctx, e.ObjectNew, q)
			case allowsDisruption(pdb) && r.wake(ctx, pdb):
			case onlyCharged(old, pdb):
			default:
				enqueue(ctx, pdb, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, e.Object, q)
		},
	}
}

// allowsDisruption reports whether the PDB's status, computed for its
// current spec, allows a disruption.
func allowsDisruption(pdb *policyv1.PodDisruptionBudget) bool {
	return pdb.Status.DisruptionsAllowed > 0 && pdb.Status.ObservedGeneration >= pdb.Generation
}

// onlyCharged reports whether the PDB allows fewer disruptions than before
// for the same spec and pods: what an eviction does to it.
func onlyCharged(old, cur *policyv1.PodDisruptionBudget) bool {
	return cur.Status.DisruptionsAllowed < old.Status.DisruptionsAllowed && cur.Generation == old.Generation &&
		cur.Status.ExpectedPods == old.Status.ExpectedPods
}

// wake hands the PDB's parked queues to the Evictor and records the wake-up
// delay of the first eviction it sends.
func (r *Reconciler) wake(ctx context.Context, pdb *policyv1.PodDisruptionBudget) bool {
	changed := r.Clock.Now()
	return r.Evictor.Wake(ctx, pdb, func() { wakeupDelay.Observe(r.Clock.Since(changed).Seconds()) })
}

// attachedNode maps a VolumeAttachment to its node, if that node is being
// terminated.
func (r *Reconciler) attachedNode(ctx context.Context, o client.Object) []reconcile.Request {
	va, ok := o.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.NodeName == "" {
		return nil
	}
	var node corev1.Node
	if err := r.Client.Get(ctx, client.ObjectKey{Name: va.Spec.NodeName}, &node); err != nil || !ngv1alpha1.TerminatingUnderFinalizer(&node) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: node.Name}}}
}

// terminatingNodes maps a PDB change to the nodes this controller is
// terminating whose eviction queues include that PDB, and to those not
// drained yet (their queues are unknown until their first drain pass). It
// reads the controller's own record, not the node cache: PDB status changes
// come with every pod readiness change in the cluster, and a copy of every
// cached node for each would cost more than the few it finds.
func (r *Reconciler) terminatingNodes(_ context.Context, pdb client.Object) []reconcile.Request {
	names := r.phases.nodeNames()
	r.mu.Lock()
	defer r.mu.Unlock()
	var reqs []reconcile.Request
	for _, name := range names {
		if queues, known := r.queues[name]; !known || queues[pdb.GetUID()] {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
	return reqs
}

// rememberQueues records the PDBs the node's drain waits on.
func (r *Reconciler) rememberQueues(node string, groups []drain.Group) {
	queues := make(map[types.UID]bool, len(groups))
	for _, g := range groups {
		queues[g.UID] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.queues == nil {
		r.queues = map[string]map[types.UID]bool{}
	}
	r.queues[node] = queues
}

// phase is one step of termination. A non-zero Result means "wait": later
// phases do not run in this pass.
type phase struct {
	name string
	run  func(context.Context, *corev1.Node) (reconcile.Result, error)
}

// Reconcile runs the phases in order and stops at the first that waits.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	node, err := r.readNode(ctx, req.NamespacedName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetName(ctx, req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !ngv1alpha1.TerminatingUnderFinalizer(node) {
		r.forget(ctx, node.UID)
		return reconcile.Result{}, nil
	}
	if r.instanceGone(ctx, node) {
		_, err := r.releaseGone(ctx, node)
		r.forget(ctx, node.UID)
		return reconcile.Result{}, err
	}
	phases := []phase{
		{phaseLease, r.holdMaintenanceLease},
		{phaseCordon, r.cordon},
		{phaseTraffic, r.cutTraffic},
		{phaseDrainSlot, r.waitForDrainSlot},
		{phaseDrain, r.drain},
		{phaseVolumes, r.waitForVolumes},
		{phaseRelease, r.release},
	}
	if karpenterOwned(node) {
		phases = []phase{
			{phaseTraffic, r.cutTraffic},
			{phaseRelease, r.releaseToKarpenter},
		}
	}
	result, err := r.runPhases(ctx, node, phases)
	if ferr := r.flushConditions(ctx, node); ferr != nil && err == nil {
		return reconcile.Result{}, fmt.Errorf("node %s: %w", node.Name, ferr)
	}
	return result, err
}

// runPhases runs the phases in order and stops at the first that waits; the
// node is forgotten once the last is done.
func (r *Reconciler) runPhases(ctx context.Context, node *corev1.Node, phases []phase) (reconcile.Result, error) {
	for _, p := range phases {
		r.phases.set(node.UID, node.Name, p.name)
		result, err := p.run(ctx, node)
		if apierrors.IsConflict(err) {
			// Another writer changed what this pass read (the taint watcher
			// records AdminState Down on the node as its deletion lands): not
			// a failure; the next pass reads it again.
			logf.FromContext(ctx).V(1).Info("Changed by another writer during the pass; looking again", "phase", p.name, "error", err.Error())
			return reconcile.Result{RequeueAfter: requeue.AfterConflict}, nil
		}
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("%s phase of node %s: %w", p.name, node.Name, err)
		}
		if !result.IsZero() {
			if held := r.reportCondition(node, p.name); held > 0 && held < result.RequeueAfter {
				result.RequeueAfter = held
			}
			return result, nil
		}
	}
	r.forget(ctx, node.UID)
	return reconcile.Result{}, nil
}

// readNode reads the node for a pass: from the cache when this process
// drains it (its last pass came to the drain slot or the drain, so it holds
// the node's Lease and its traffic is cut), else fresh from the API server.
// A draining node's passes come with its pods' going and its slot's
// handoff, and a fresh read of a node is a round trip before each eviction
// on an API server busy with a fleet's drain. A node in any other phase is
// read fresh: a stale node that was already released must not take its
// maintenance Lease again (a release forgets the node here).
func (r *Reconciler) readNode(ctx context.Context, key types.NamespacedName) (*corev1.Node, error) {
	if uid, ok := r.phases.draining(key.Name); ok {
		node := &corev1.Node{}
		if err := r.Client.Get(ctx, key, node); err == nil && node.UID == uid && ngv1alpha1.TerminatingUnderFinalizer(node) {
			return node, nil
		}
	}
	return r.readNodeFresh(ctx, key)
}

// readNodeFresh reads the node from the API server into a new object: a
// decode into an old one would keep fields the answer omits.
func (r *Reconciler) readNodeFresh(ctx context.Context, key types.NamespacedName) (*corev1.Node, error) {
	node := &corev1.Node{}
	return node, r.Reader.Get(ctx, key, node)
}

// startLeading records when this process started leading (the manager
// starts it with the controllers, once elected).
func (r *Reconciler) startLeading(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leadingSince = r.Clock.Now()
	return nil
}

// drainBeganHere reports whether this process began the node's drain (it
// cordoned the node after it started leading); the cordon time has whole
// seconds once read back, so a drain begun in the same second does not count.
func (r *Reconciler) drainBeganHere(node *corev1.Node) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.leadingSince.IsZero() && terminationStarted(node).After(r.leadingSince)
}

// forgetName drops the state of a node that is gone, found by name.
func (r *Reconciler) forgetName(ctx context.Context, name string) {
	for _, uid := range r.phases.uids(name) {
		r.forget(ctx, uid)
	}
}

func (r *Reconciler) forget(ctx context.Context, uid types.UID) {
	r.phases.mu.Lock()
	name := r.phases.names[uid]
	r.phases.mu.Unlock()
	r.phases.forget(uid)
	r.repl.forget(uid)
	r.giveDrainSlot(ctx, uid)
	if name != "" {
		r.pods.unwatch(name)
		r.Evictor.ForgetNode(name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.queues, name)
	delete(r.waiting, uid)
	delete(r.backoff, uid)
	delete(r.reported, uid)
	delete(r.waitingFor, uid)
	delete(r.conditions, uid)
	delete(r.staged, uid)
	delete(r.drainedAt, uid)
}

// once reports whether key is new for the node, remembering it.
func (r *Reconciler) once(node types.UID, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reported == nil {
		r.reported = map[types.UID]map[string]bool{}
	}
	if r.reported[node] == nil {
		r.reported[node] = map[string]bool{}
	}
	if r.reported[node][key] {
		return false
	}
	r.reported[node][key] = true
	return true
}

// event records an event on the node.
func (r *Reconciler) event(node *corev1.Node, eventType, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(node, nil, eventType, reason, actionTerminate, format, args...)
	}
}
