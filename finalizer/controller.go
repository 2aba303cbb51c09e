package finalizer

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/karpenter"
	"github.com/nodeguard/nodeguard/kube/requeue"
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
	// pickUpPoll paces the look for a drain of a cordoned node nobody has
	// charged, for pickUpWindow after the cordon was first seen: evictions
	// that passed nodeguard by (its webhook unreachable) show only on their
	// pods while they terminate, and no pod of an unfollowed node is
	// watched. A drain follows its cordon within moments; a node left
	// cordoned for days is not read twice a minute.
	pickUpPoll   = 30 * time.Second
	pickUpWindow = 5 * time.Minute
)

// AdminState is what the controller needs of the Azure admin-state manager.
type AdminState interface {
	SetDesired(node *corev1.Node, state azure.AdminState)
	// Confirmation says where the cut stands, waiting at most wait;
	// WaitConfirmed waits until it is settled (a background wake-up).
	Confirmation(ctx context.Context, uid types.UID, state azure.AdminState, wait time.Duration) (azure.Confirmation, error)
	WaitConfirmed(ctx context.Context, uid types.UID, state azure.AdminState) error
	// NothingCut says whether the confirmed Down cut nothing: the node is in
	// no backend pool.
	NothingCut(uid types.UID) bool
	// CutNote says how the cut differs from AdminState Down on every entry
	// (entries their owner removed from a pool); "" when it does not.
	CutNote(uid types.UID) string
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
	// Outside, when set, follows drains nodeguard did not start (follow.go).
	Outside *OutsideDrains

	phases phases
	slots  drainSlots
	repl   replacements
	// pods watches the pods of the nodes being drained (nil: they are polled).
	pods *nodePods
	// wakeups asks for passes of nodes whose wait ended (pods, traffic cut);
	// slotWakeups for those of nodes that may take a drain slot, first;
	// releaseWakeups for those of emptied nodes, after those.
	wakeups, slotWakeups, releaseWakeups chan event.GenericEvent
	// mu guards what follows. memory is what the controller remembers of
	// each node it terminates (memory.go).
	mu     sync.Mutex
	memory map[types.UID]*nodeMemory
	// leadingSince is when this process started leading: a drain that began
	// later is its own, and r.repl knows every restart made for it.
	leadingSince time.Time
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
		if r.followed(node) {
			return r.follow(ctx, node)
		}
		if by, ended := r.unfollowedDrainEnded(node); ended {
			return r.endDrain(ctx, node, by)
		}
		r.forget(ctx, node.UID)
		return reconcile.Result{}, nil
	}
	r.overlayStaged(node)
	r.markPassing(node.UID, true) // until its phases are done (the release forgets the node)
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
	if karpenter.Finalized(node) {
		phases = []phase{
			{phaseTraffic, r.cutTraffic},
			{phaseRelease, r.releaseToKarpenter},
		}
	}
	result, err := r.runPhases(ctx, node, phases)
	// The pass's phases are done: a timer from now on writes what is due,
	// beside this flush (one write at a time), and none is left unwritten.
	r.markPassing(node.UID, false)
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
		if again, lost := requeue.OnConflict(err); lost {
			// Another writer changed what this pass read (the taint watcher
			// records AdminState Down on the node as its deletion lands): not
			// a failure; the next pass reads it again.
			logf.FromContext(ctx).V(1).Info("Changed by another writer during the pass; looking again", "phase", p.name, "error", err.Error())
			return again, nil
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
	stopStatusTimer(r.memory[uid])
	delete(r.memory, uid)
}

// event records an event on the node.
func (r *Reconciler) event(node *corev1.Node, eventType, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(node, nil, eventType, reason, actionTerminate, format, args...)
	}
}
