package finalizer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

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
		For(&corev1.Node{}, builder.WithPredicates(nodeChanged(r.watchedOutside))).
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
	nodes := r.phases.nodes()
	r.mu.Lock()
	defer r.mu.Unlock()
	var reqs []reconcile.Request
	for uid, name := range nodes {
		if queues := r.recall(uid).queues; queues == nil || queues[pdb.GetUID()] {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
	return reqs
}
