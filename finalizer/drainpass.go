package finalizer

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// drain runs one pass of evictions and waits until the node's pods are gone.
// The node's pods are watched while it drains: a pod going wakes the next
// pass. After a 429 the PDB's queue parks until the PDB's status allows a
// disruption, which sends its next eviction at once (pdbHandler); the
// requeue is only a backstop.
func (r *Reconciler) drain(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if _, done := r.drainEnded(node); done {
		r.stopDraining(ctx, node)
		r.markDrained(node)
		return reconcile.Result{}, nil
	}
	r.markDrainInProgress(node)
	r.pods.watch(node.Name)
	deadline, hasDeadline := r.drainDeadline(ctx, node)
	pastDeadline := hasDeadline && !r.Clock.Now().Before(deadline)
	mark := r.Evictor.Mark()
	plan, fromWatch, err := r.plan(ctx, node, pastDeadline, false)
	if err == nil && fromWatch && plan.Remaining() == 0 {
		// The watch may lag: only a fresh list proves the node empty.
		plan, _, err = r.plan(ctx, node, pastDeadline, true)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	plan.WakeMark = mark
	r.rememberQueues(node.UID, plan.Groups)
	r.reportGivenUp(node, plan)
	if plan.Remaining() == 0 {
		r.stopDraining(ctx, node)
		drainDuration.Observe(r.Clock.Since(terminationStarted(node)).Seconds())
		r.progress(node.UID, "drained: every evictable pod is gone")
		r.markDrained(node)
		r.recordDrained(node.UID)
		return reconcile.Result{}, nil
	}
	settling, err := r.replaceBlocked(ctx, node, plan, pastDeadline)
	if err != nil {
		return reconcile.Result{}, err
	}
	if pastDeadline {
		return r.deleteRemaining(ctx, node, plan, deadline)
	}
	// A node with pods to evict needs a slot; one that holds its slot while
	// its pods terminate says so, so that the slot does not expire.
	send := r.sendable(plan)
	if send || r.slots.holds(node.UID) {
		if ok, _ := r.takeSlot(node); !ok {
			r.waitFor(node.UID, "waiting for a drain slot to evict again (--max-concurrent-drains): %s", waitingMessage(plan, drain.Outcome{}))
			return reconcile.Result{RequeueAfter: r.byDeadline(min(r.podsGoneWait(), slotWaitBackstop), deadline, hasDeadline)}, nil
		}
	} else {
		r.wakeInLine(ctx, r.slots.leaveLine(r.Opts.MaxConcurrentNodes, node.UID))
	}
	if send {
		r.observeHandoff(node.UID)
	}
	r.noteLosses(node, plan)
	out := r.Evictor.Evict(ctx, node.Name, plan)
	if waitsOnlyOnPDBs(plan, out) {
		r.stepAside(ctx, node.UID)
	}

	for _, err := range out.Errs {
		logf.FromContext(ctx).Error(err, "Eviction failed; retrying", "node", node.Name)
	}
	stalled := r.reportBlockers(node, plan, out)
	r.reportLosses(node, stalled)
	if !hasDeadline {
		deadline = time.Time{}
	}
	r.waitFor(node.UID, "%s", drainMessage(plan, out, r.drainStarted(node), deadline, r.Clock.Now()))
	next := r.nextDrainPass(node.UID, plan, out)
	if settling > 0 && settling < next {
		next = settling
	}
	return reconcile.Result{RequeueAfter: r.byDeadline(next, deadline, hasDeadline)}, nil
}

// recordDrained remembers when the node's drain ended, to the nanosecond; the
// Drained condition keeps it to the second once written (a node whose
// release waits for its volumes), which a restart reads.
func (r *Reconciler) recordDrained(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remember(uid).drainedAt = r.Clock.Now()
}

// drainEnded is when the node's drain ended: this process's record (a
// release that failed does not drain again), else the Drained condition
// written since the deletion (a drain by someone else before it does not
// count), else the annotation an earlier version wrote.
func (r *Reconciler) drainEnded(node *corev1.Node) (time.Time, bool) {
	r.mu.Lock()
	at := r.recall(node.UID).drainedAt
	r.mu.Unlock()
	if !at.IsZero() {
		return at, true
	}
	if c := nodeCondition(node, corev1.NodeDrained); c != nil && c.Status == corev1.ConditionTrue &&
		node.DeletionTimestamp != nil && !c.LastTransitionTime.Before(node.DeletionTimestamp) {
		return c.LastTransitionTime.Time, true
	}
	return ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainedAtAnnotation)
}

// byDeadline shortens a wait so that the drain looks again when its deadline
// passes, not up to a backstop later.
func (r *Reconciler) byDeadline(wait time.Duration, deadline time.Time, hasDeadline bool) time.Duration {
	if !hasDeadline {
		return wait
	}
	return min(wait, deadline.Sub(r.Clock.Now())+time.Millisecond)
}

// stopDraining ends the watch of the node's pods and its parked queues, and
// gives its drain slot to the next node in line.
func (r *Reconciler) stopDraining(ctx context.Context, node *corev1.Node) {
	r.pods.unwatch(node.Name)
	r.Evictor.Forget(node.Name)
	r.giveDrainSlot(ctx, node.UID)
}

// plan sorts the node's pods and the PDBs (cached) for eviction. The pods come
// from the node's watch once it has synced; before that, or when fresh is
// set, from a list by field selector (there is no cluster-wide pod cache).
// fromWatch says which.
func (r *Reconciler) plan(ctx context.Context, node *corev1.Node, pastDeadline, fresh bool) (plan *drain.Plan, fromWatch bool, err error) {
	return r.planWith(ctx, node, pastDeadline, fresh, r.Opts.DaemonSets)
}

// planWith is plan with the DaemonSet policy given.
func (r *Reconciler) planWith(ctx context.Context, node *corev1.Node, pastDeadline, fresh bool, daemonSets drain.DaemonSetPolicy) (plan *drain.Plan, fromWatch bool, err error) {
	pods, fromWatch := r.pods.cached(node.Name)
	if fresh || !fromWatch {
		var list corev1.PodList
		if err := r.Reader.List(ctx, &list, r.podListOptions(node.Name)...); err != nil {
			return nil, false, fmt.Errorf("listing pods of the node: %w", err)
		}
		pods, fromWatch = list.Items, false
	}
	var pdbs policyv1.PodDisruptionBudgetList
	if err := r.Client.List(ctx, &pdbs); err != nil {
		return nil, false, fmt.Errorf("listing PodDisruptionBudgets: %w", err)
	}
	plan, err = drain.NewPlan(pods, pdbs.Items, drain.PlanOptions{
		DaemonSets:         daemonSets,
		Now:                r.Clock.Now(),
		NodeDeleted:        deletedAt(node),
		EvictedControllers: r.Evictor.EvictedControllers(node.Name),
		StuckMargin:        r.Opts.StuckPodMargin,
		Unreachable:        unreachable(node),
		PastDeadline:       pastDeadline,
	})
	return plan, fromWatch, err
}

// podListOptions lists the node's pods by field selector. With the node's
// pod watch, the list is not older than what the watch saw last: kube-
// apiserver's watch cache as it stands, at most a moment behind etcd, which
// shows a pod bound to the node that the watch has not delivered yet. A
// consistent list would also show one bound in that moment, but when kube-
// apiserver cannot serve it from its cache at once it reads every pod of the
// cluster from etcd to select the node's: under a fleet's drain such lists
// ran into kube-apiserver's 60 s timeout and held emptied nodes a minute.
func (r *Reconciler) podListOptions(node string) []client.ListOption {
	opts := []client.ListOption{client.MatchingFields{"spec.nodeName": node}}
	if rv := r.pods.version(node); rv != "" {
		opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{
			ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		}})
	}
	return opts
}

// deletedAt is when the node's deletion began (zero: it is not deleting).
func deletedAt(node *corev1.Node) time.Time {
	if node.DeletionTimestamp == nil {
		return time.Time{}
	}
	return node.DeletionTimestamp.Time
}

// unreachable reports whether no kubelet will confirm pod deletions on the
// node: its Ready condition is Unknown (the node lifecycle controller's mark
// of a silent kubelet); or it is not Ready and the cloud says its VM is shut
// down (the cloud node lifecycle controller's shutdown taint), so the kubelet
// stopped with it; or it carries the out-of-service taint (an administrator's
// word for the same).
func unreachable(node *corev1.Node) bool {
	var shutDown bool
	for _, t := range node.Spec.Taints {
		switch t.Key {
		case ngv1alpha1.OutOfServiceTaintKey:
			return true
		case ngv1alpha1.CloudShutdownTaintKey:
			shutDown = true
		}
	}
	c := ngv1alpha1.ReadyCondition(node)
	return c != nil && (c.Status == corev1.ConditionUnknown || shutDown && c.Status == corev1.ConditionFalse)
}

// reportGivenUp names, once each, the terminating pods the drain stopped
// waiting for. Once the node is gone, the pod garbage collector finishes them,
// as after a plain kubectl delete node.
func (r *Reconciler) reportGivenUp(node *corev1.Node, plan *drain.Plan) {
	for _, g := range plan.GivenUp {
		if r.once(node.UID, "given-up/"+string(g.Pod.UID)) {
			podsGivenUp.WithLabelValues(g.Cause).Inc()
			r.event(node, corev1.EventTypeWarning, ReasonPodGivenUp,
				"no longer waiting for pod %s/%s: %s; once the node is gone, the pod garbage collector removes it", g.Pod.Namespace, g.Pod.Name, g.Reason)
		}
	}
}

func hasEmptyDir(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			return true
		}
	}
	return false
}

// nextDrainPass is when to look again. With the node's pods and PDBs
// watched, their changes wake the drain, and this is a backstop. Without, soon
// while pods are going away, with a growing backstop while every queue is
// blocked.
func (r *Reconciler) nextDrainPass(uid types.UID, plan *drain.Plan, out drain.Outcome) time.Duration {
	if r.pods != nil {
		return r.podsGoneWait()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(uid)
	if out.Evicted > 0 || len(plan.Terminating) > 0 {
		m.backoff = 0
		return podsGonePoll
	}
	m.backoff = min(max(m.backoff*2, podsGonePoll), blockedBackstopMax)
	return m.backoff
}

// podsGoneWait is when to look again while pods terminate: the watch of the
// node's pods wakes the drain as they go; without one, poll.
func (r *Reconciler) podsGoneWait() time.Duration {
	switch {
	case r.pods == nil:
		return podsGonePoll
	case r.Opts.DrainBackstop > 0:
		return r.Opts.DrainBackstop
	}
	return DefaultDrainBackstop
}

// Pacing of the DrainWaiting events: one once what the drain waits for has
// stayed the same for drainWaitingAfter (the drain made no progress), the
// next for another wait that lasts as long, at most every
// drainWaitingInterval. A drain that keeps going, however long, says it all
// in NodeReleased; the Terminating condition says what it waits for now. A
// fleet's drains go on for minutes, and an event a node every 30 s of them
// would outnumber every other write.
const (
	drainWaitingAfter    = 30 * time.Second
	drainWaitingInterval = time.Minute
)

// reportBlockers emits, once each, an event per pod the drain cannot evict,
// and a DrainWaiting event when the drain stalls, so that kubectl describe
// node tells the story. It reports whether the drain has stalled.
func (r *Reconciler) reportBlockers(node *corev1.Node, plan *drain.Plan, out drain.Outcome) (stalled bool) {
	for _, pod := range append(plan.MultiplePDBs, out.MultiplePDBs...) {
		if r.once(node.UID, "multi/"+string(pod.UID)) {
			r.event(node, corev1.EventTypeWarning, ReasonPodUnderMultiplePDBs,
				"pod %s/%s is selected by more than one PodDisruptionBudget, so the Eviction API refuses it; fix the PDBs or delete the pod", pod.Namespace, pod.Name)
		}
	}
	for _, pod := range plan.DoNotEvict {
		if r.once(node.UID, "dne/"+string(pod.UID)) {
			r.event(node, corev1.EventTypeNormal, ReasonDoNotEvictPodBlocking,
				"waiting for pod %s/%s (%s=true) to go on its own", pod.Namespace, pod.Name, ngv1alpha1.DoNotEvictAnnotation)
		}
	}
	msg := waitingMessage(plan, out)
	now := r.Clock.Now()
	r.mu.Lock()
	m := r.remember(node.UID)
	if m.wait.message != msg {
		m.wait = writtenMessage{message: msg, at: now}
	}
	stalled = now.Sub(m.wait.at) >= drainWaitingAfter
	last := m.waiting
	// A drain pass runs on every change: events must not follow each one.
	due := stalled && last.message != msg && (last.at.IsZero() || now.Sub(last.at) >= drainWaitingInterval)
	if due {
		m.waiting = writtenMessage{message: msg, at: now}
	}
	r.mu.Unlock()
	if due {
		r.event(node, corev1.EventTypeNormal, ReasonDrainWaiting, "%s", msg)
	}
	return stalled
}

// waitingMessage says what the drain waits for, e.g. "waiting for 5 pods: 3
// under PDB demo/web (eviction refused: 429), 1 terminating, 1 do-not-evict".
func waitingMessage(plan *drain.Plan, out drain.Outcome) string {
	var parts []string
	blocked := map[types.NamespacedName]bool{}
	for _, b := range out.Blocked {
		blocked[b] = true
	}
	for _, g := range plan.Groups {
		state := fmt.Sprintf("allows %d disruptions", g.Allowed)
		switch {
		case g.Note != "":
			state += "; " + g.Note
		case blocked[g.PDB]:
			state += "; eviction refused, waiting for its status to change"
		}
		parts = append(parts, fmt.Sprintf("%d under PDB %s (%s)", len(g.Pods)+len(g.Replacing), g.PDB, state))
	}
	add := func(n int, what string) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(len(plan.Unprotected), "without PDB")
	add(len(plan.Terminating), "terminating")
	add(len(plan.DoNotEvict), "annotated do-not-evict")
	add(len(plan.MultiplePDBs)+len(out.MultiplePDBs), "under several PDBs")
	if len(plan.Later) > 0 {
		parts = append(parts, fmt.Sprintf("%d in later tiers (system-critical, then DaemonSet)", len(plan.Later)))
	}
	return fmt.Sprintf("waiting for %s (evicting %s pods): %s", pods(plan.Remaining()), plan.Tier, strings.Join(parts, ", "))
}

// drainDeadline is deletion time plus the node's drain timeout: the shortest
// of its own (annotation, else --drain-timeout) and its budgets'
// drainTimeout; ok is false when there is none.
func (r *Reconciler) drainDeadline(ctx context.Context, node *corev1.Node) (time.Time, bool) {
	// The budgets come from the cache (the budget status controller watches
	// them), so this costs no request. Unread, the node's own timeout holds
	// for this pass and the next pass reads them again.
	var ndbs ngv1alpha1.NodeDisruptionBudgetList
	if err := r.Client.List(ctx, &ndbs); err != nil {
		logf.FromContext(ctx).Error(err, "Listing NodeDisruptionBudgets for the drain deadline; the node's own timeout applies", "node", node.Name)
	}
	timeout, _, err := drain.Timeout(node, r.Opts.DrainTimeout, ndbs.Items)
	if err != nil && r.once(node.UID, "bad-timeout") {
		r.event(node, corev1.EventTypeWarning, ReasonDrainDeadlineExceeded, "%v", err)
	}
	if timeout <= 0 {
		return time.Time{}, false
	}
	return node.DeletionTimestamp.Add(timeout), true
}

// deleteRemaining is the deadline's policy: the pods still on the node are
// deleted (not evicted), PDBs and do-not-evict notwithstanding; except pods
// a restart of their Deployment is replacing, which are left to its
// controller while the replacement progresses: the budget promise holds.
func (r *Reconciler) deleteRemaining(ctx context.Context, node *corev1.Node, plan *drain.Plan, deadline time.Time) (reconcile.Result, error) {
	doomed := append(append(append(append([]*corev1.Pod{}, plan.Unprotected...), plan.MultiplePDBs...), plan.DoNotEvict...), plan.Later...)
	var replacing []string
	for _, g := range plan.Groups {
		doomed = append(doomed, g.Pods...)
		for _, p := range g.Replacing {
			replacing = append(replacing, p.Namespace+"/"+p.Name)
		}
	}
	if r.once(node.UID, "deadline") {
		msg := fmt.Sprintf("drain deadline %s passed with %s left: deleting %d without regard to PodDisruptionBudgets",
			deadline.UTC().Format(time.RFC3339), pods(plan.Remaining()), len(doomed))
		if len(replacing) > 0 {
			msg += fmt.Sprintf("; leaving %v to the rollouts replacing them", replacing)
		}
		r.event(node, corev1.EventTypeWarning, ReasonDrainDeadlineExceeded, "%s", msg)
	}
	if len(replacing) > 0 {
		r.waitFor(node.UID, "drain deadline passed; waiting for %s that their Deployments' rollouts replace: %s", pods(len(replacing)), groupNotes(plan))
	}
	r.Evictor.Forget(node.Name) // nothing waits for a PDB any more
	if err := r.Evictor.Delete(ctx, doomed); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.podsGoneWait()}, nil
}

// groupNotes joins what replacement first says about the queues.
func groupNotes(plan *drain.Plan) string {
	var notes []string
	for _, g := range plan.Groups {
		if g.Note != "" {
			notes = append(notes, fmt.Sprintf("PDB %s: %s", g.PDB, g.Note))
		}
	}
	return strings.Join(notes, "; ")
}

// pods counts pods in words: "1 pod", "3 pods".
func pods(n int) string { return count(n, "pod") }

// count is "1 pod" or "3 pods": n of the noun, plural when not one.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// roughly rounds a duration for messages that should not change every pass:
// to the minute, or to the second in the last minute.
func roughly(d time.Duration) string {
	if d > time.Minute {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}

// writtenMessage is a message and when: a node's last DrainWaiting event,
// or what its drain waits for and since when.
type writtenMessage struct {
	message string
	at      time.Time
}
