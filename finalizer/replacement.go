package finalizer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// Replacement first. A PDB that allows no disruption while every pod it counts
// is healthy (one replica under minAvailable: 1, N under minAvailable: N) is
// blocked by design: evictions get 429 forever. Once a queue has been so for
// --blocked-pdb-settle, nodeguard restarts the pods' Deployment, as kubectl
// rollout restart does (pod-template annotation nodeguard.io/restartedAt), when
// its rolling update surges and cannot take the PDB below its desired healthy
// count. The Deployment controller then starts new pods on other nodes (this
// one is cordoned), waits for them to be Ready and only then stops the old
// ones. nodeguard never evicts or deletes those pods itself.
//
// The restart's time, on the Deployment, is the durable record: a restart made
// after a drain began replaces every old pod of that drain, so it serves every
// node cordoned before it (once per Deployment for several draining nodes), and
// a drain it serves never restarts the Deployment again.

// Defaults of the replacement options.
const (
	DefaultBlockedPDBSettle   = 10 * time.Second
	DefaultReplacementTimeout = 5 * time.Minute
)

// restartLead: a restart serves a drain when it came at least this long after
// the drain began. The start (the draining taint's time) has whole seconds, and
// the scheduler must have seen the node cordoned before the new pods were
// created, or one could land on it.
const restartLead = time.Second

// replacements is what the controller remembers between passes; the cluster
// (restart times on Deployments, cordon times on nodes) says the rest.
type replacements struct {
	mu sync.Mutex
	// since: when each node's queue (by PDB) was first seen blocked by design.
	since map[types.UID]map[types.UID]time.Time
	// restarted: the Deployments restarted for each node's drain.
	restarted map[types.UID]map[types.UID]bool
	// watched: PDBs under which a restart was made or found. Their queues are
	// looked at on every pass, blocked or not: once the first new pod is
	// Ready the PDB allows a disruption, and the old pods must still be left
	// to their controller.
	watched map[types.UID]bool
	// surveyed: nodes whose queues were all looked at once since this process
	// started, to find restarts made before it (drains it did not begin).
	surveyed map[types.UID]bool
	// stalled: restarts already counted as stalled (Deployment UID/time).
	stalled map[string]bool
}

// settle tracks how long the queue has been blocked by design: settled once
// it has been so for at least d; otherwise wait is how long is left.
func (s *replacements) settle(node types.UID, g *drain.Group, now time.Time, d time.Duration) (settled bool, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !g.ByDesign {
		delete(s.since[node], g.UID)
		return false, 0
	}
	if s.since == nil {
		s.since = map[types.UID]map[types.UID]time.Time{}
	}
	if s.since[node] == nil {
		s.since[node] = map[types.UID]time.Time{}
	}
	since, ok := s.since[node][g.UID]
	if !ok {
		since = now
		s.since[node][g.UID] = now
	}
	if left := since.Add(d).Sub(now); left > 0 {
		return false, left
	}
	return true, 0
}

func (s *replacements) wasSurveyed(node types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.surveyed[node]
}

func (s *replacements) markSurveyed(node types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.surveyed == nil {
		s.surveyed = map[types.UID]bool{}
	}
	s.surveyed[node] = true
}

func (s *replacements) watch(pdb types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watched == nil {
		s.watched = map[types.UID]bool{}
	}
	s.watched[pdb] = true
}

func (s *replacements) watching(pdb types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watched[pdb]
}

func (s *replacements) markRestarted(node, deployment types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.restarted == nil {
		s.restarted = map[types.UID]map[types.UID]bool{}
	}
	if s.restarted[node] == nil {
		s.restarted[node] = map[types.UID]bool{}
	}
	s.restarted[node][deployment] = true
}

func (s *replacements) wasRestarted(node, deployment types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarted[node][deployment]
}

// countStall reports whether the restart is newly stalled.
func (s *replacements) countStall(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalled[key] {
		return false
	}
	if s.stalled == nil {
		s.stalled = map[string]bool{}
	}
	s.stalled[key] = true
	return true
}

func (s *replacements) forget(node types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.since, node)
	delete(s.restarted, node)
	delete(s.surveyed, node)
}

// replaceBlocked runs replacement first over the plan's queues: it holds the
// pods a restart of their Deployment replaces (Group.Hold), restarts a
// Deployment when the policy and the rule allow, and otherwise leaves the pods
// queued, saying why in Group.Note and in events. It returns how soon a queue
// that is settling is due for its decision (0: none is).
func (r *Reconciler) replaceBlocked(ctx context.Context, node *corev1.Node, plan *drain.Plan, pastDeadline bool) (time.Duration, error) {
	p := &replacePass{
		r: r, node: node, started: terminationStarted(node), now: r.Clock.Now(), pastDeadline: pastDeadline,
		replicaSets: map[types.NamespacedName]*appsv1.ReplicaSet{}, deployments: map[types.NamespacedName]*appsv1.Deployment{},
		rollouts: map[types.UID]*rollout{}, conflicted: map[types.UID]bool{}, unavailable: map[types.UID]map[types.UID]int32{},
	}
	// Which queues to look at: on the first pass over a drain this process
	// did not begin, every one, for restarts an earlier process made (a drain
	// begun here has them all in r.repl, and its first evictions need not wait
	// for the reads); those under a PDB a restart was made or found for; and
	// those blocked by design once settled, for the decision. A queue still
	// settling needs no read: any restart that could serve it is one of those.
	first := !r.repl.wasSurveyed(node.UID) && !r.drainBeganHere(node)
	settles := make([]settle, len(plan.Groups))
	var due time.Duration
	for i := range plan.Groups {
		s := &settles[i]
		s.settled, s.wait = r.repl.settle(node.UID, &plan.Groups[i], p.now, r.Opts.BlockedPDBSettle)
		if s.wait > 0 && (due == 0 || s.wait < due) {
			due = s.wait
		}
		s.surveyed = first || r.repl.watching(plan.Groups[i].UID) || s.settled
	}
	p.prefetch(ctx, plan, settles)
	for i := range plan.Groups {
		g, s := &plan.Groups[i], settles[i]
		if !s.surveyed {
			if g.ByDesign && !pastDeadline {
				g.Note = settlingNote(g, s.wait)
			}
			continue
		}
		var notes []string
		for _, pod := range slices.Clone(g.Pods) {
			note, err := p.decide(ctx, g, pod, s.settled, s.wait)
			if err != nil {
				return 0, err
			}
			if note != "" && !slices.Contains(notes, note) {
				notes = append(notes, note)
			}
		}
		g.Note = strings.Join(notes, "; ")
	}
	r.repl.markSurveyed(node.UID)
	return due, nil
}

// settle is where a queue stands in replacement first this pass.
type settle struct {
	// settled: blocked by design for --blocked-pdb-settle; otherwise wait
	// is what is left of it (0: not blocked by design).
	settled bool
	wait    time.Duration
	// surveyed: the pass reads the queue's workloads.
	surveyed bool
}

// settlingNote says that a queue blocked by design waits for the decision.
func settlingNote(g *drain.Group, wait time.Duration) string {
	return fmt.Sprintf("blocked by design (%s): deciding in %s", budgetNumbers(g), wait.Round(time.Second))
}

// replacePass is one drain pass's replacement work; it reads each
// ReplicaSet, Deployment and rollout at most once.
type replacePass struct {
	r            *Reconciler
	node         *corev1.Node
	started, now time.Time
	pastDeadline bool

	replicaSets map[types.NamespacedName]*appsv1.ReplicaSet
	deployments map[types.NamespacedName]*appsv1.Deployment
	rollouts    map[types.UID]*rollout
	// conflicted: Deployments whose restart lost a race in this pass; the next
	// pass reads them again.
	conflicted map[types.UID]bool
	// unavailable: per PDB, the maxUnavailable of each Deployment whose
	// rollout replaces pods of the queue.
	unavailable map[types.UID]map[types.UID]int32
}

// decide handles one queued pod and returns what the condition should say.
func (p *replacePass) decide(ctx context.Context, g *drain.Group, pod *corev1.Pod, settled bool, wait time.Duration) (string, error) {
	d, owner, err := p.deploymentOf(ctx, pod)
	if err != nil {
		return "", err
	}
	if d != nil {
		if at, ok := restartedAt(d); ok && !at.Before(p.started.Add(restartLead)) {
			return p.replaced(ctx, g, pod, d, at)
		}
	}
	switch {
	case !g.ByDesign, p.pastDeadline: // past the deadline, no new restart
		return "", nil
	case !settled:
		return settlingNote(g, wait), nil
	case d == nil:
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy wait: %s is never restarted, only Deployments whose rolling update surges are; "+
			"to let the node go, scale it up or relax the PDB so that it allows a disruption, or delete the pod yourself", owner)), nil
	}
	name := d.Namespace + "/" + d.Name
	policy, source, err := drain.PolicyFor(d, g.Budget, p.r.Opts.BlockedPDBPolicy)
	switch {
	case err != nil:
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy wait: %v", err)), nil
	case policy == drain.BlockedPDBWait:
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy wait (%s); to let the node go, annotate Deployment %s with %s: replace, scale it up or relax the PDB",
			source, name, ngv1alpha1.BlockedPDBPolicyAnnotation)), nil
	case p.r.repl.wasRestarted(p.node.UID, d.UID):
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy replace (%s), but Deployment %s was restarted for this drain already and its template changed since; scale it up or relax the PDB", source, name)), nil
	}
	if ok, why := drain.CanReplace(d, g.Healthy, g.Desired, p.otherUnavailable(g, d)); !ok {
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy replace (%s), but %s", source, why)), nil
	}
	if !drain.RolloutDone(d) {
		return fmt.Sprintf("blocked by design (%s); a rollout of Deployment %s is in progress: deciding once it is done", budgetNumbers(g), name), nil
	}
	return p.restart(ctx, g, pod, d, source)
}

// deploymentOf finds the pod's Deployment through its ReplicaSet; owner names
// the pod's controller in words when there is no Deployment.
func (p *replacePass) deploymentOf(ctx context.Context, pod *corev1.Pod) (*appsv1.Deployment, string, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return nil, fmt.Sprintf("pod %s/%s has no controller, and a pod without one", pod.Namespace, pod.Name), nil
	}
	owner := fmt.Sprintf("%s %s/%s", ref.Kind, pod.Namespace, ref.Name)
	if ref.Kind != "ReplicaSet" || ref.APIVersion != appsv1.SchemeGroupVersion.String() {
		return nil, owner, nil
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name}
	rs, err := get(ctx, p.r.Reader, p.replicaSets, key, &appsv1.ReplicaSet{})
	if err != nil || rs == nil || rs.UID != ref.UID {
		return nil, owner, err
	}
	dref := metav1.GetControllerOf(rs)
	if dref == nil || dref.Kind != "Deployment" {
		return nil, owner, nil
	}
	key.Name = dref.Name
	d, err := get(ctx, p.r.Reader, p.deployments, key, &appsv1.Deployment{})
	if err != nil || d == nil || d.UID != dref.UID {
		return nil, owner, err
	}
	return d, "Deployment " + key.String(), nil
}

func restartedAt(d *appsv1.Deployment) (time.Time, bool) {
	v, ok := d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]
	if !ok {
		return time.Time{}, false
	}
	t, err := ngv1alpha1.ParseTime(v)
	return t, err == nil
}

// otherUnavailable is what the rollouts of the queue's other Deployments
// may take down meanwhile.
func (p *replacePass) otherUnavailable(g *drain.Group, d *appsv1.Deployment) int32 {
	var n int32
	for uid, u := range p.unavailable[g.UID] {
		if uid != d.UID {
			n += u
		}
	}
	return n
}

// restart annotates the Deployment's pod template, with an optimistic lock:
// of two drains deciding at once, one restarts and the other finds the
// restart on its next pass.
func (p *replacePass) restart(ctx context.Context, g *drain.Group, pod *corev1.Pod, d *appsv1.Deployment, source string) (string, error) {
	name := d.Namespace + "/" + d.Name
	if p.conflicted[d.UID] {
		return fmt.Sprintf("blocked by design (%s); restarting Deployment %s", budgetNumbers(g), name), nil
	}
	restarted := d.DeepCopy()
	if restarted.Spec.Template.Annotations == nil {
		restarted.Spec.Template.Annotations = map[string]string{}
	}
	restarted.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation] = ngv1alpha1.FormatTime(p.now)
	err := p.r.Client.Patch(ctx, restarted, client.MergeFromWithOptions(d, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		p.conflicted[d.UID] = true
		return fmt.Sprintf("blocked by design (%s); restarting Deployment %s", budgetNumbers(g), name), nil
	case notGranted(err):
		// Installed without the replace grant (the default), with the policy
		// replace from an annotation: wait, as under the policy wait.
		return p.wait(g, pod, fmt.Sprintf("blocked-pdb-policy replace (%s), but nodeguard may not patch Deployment %s: "+
			"install it with replacement first (Helm nodeguard.blockedPDBPolicy: replace, or the kustomize component blocked-pdb-replace), scale it up or relax the PDB", source, name)), nil
	case err != nil:
		replacementRestarts.WithLabelValues(d.Namespace, restartFailed).Inc()
		return "", fmt.Errorf("restarting Deployment %s to replace pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
	}
	replacementRestarts.WithLabelValues(d.Namespace, restartDone).Inc()
	p.deployments[types.NamespacedName{Namespace: d.Namespace, Name: d.Name}] = restarted
	p.r.repl.markRestarted(p.node.UID, d.UID)
	p.r.repl.watch(g.UID)
	p.r.once(p.node.UID, "held/"+string(pod.UID)) // this event says it
	p.r.event(p.node, corev1.EventTypeNormal, ReasonDrainBlockedByBudget,
		"pod %s/%s is under PDB %s, which allows no disruption although every pod it expects is healthy (%s): nodeguard restarted Deployment %s (blocked-pdb-policy replace, %s), so that its controller starts a replacement on another node before it stops this pod",
		pod.Namespace, pod.Name, g.PDB, budgetNumbers(g), name, source)
	if p.r.Recorder != nil {
		p.r.Recorder.Eventf(restarted, p.node, corev1.EventTypeNormal, ReasonRestartedForDrain, actionRestart,
			"restarted (pod template annotation %s) so that its pods on draining node %s are replaced before they stop: PDB %s allows no disruption",
			ngv1alpha1.RestartedAtAnnotation, p.node.Name, g.PDB)
	}
	return p.replaced(ctx, g, pod, restarted, p.now)
}

// replaced handles a pod whose Deployment was restarted for this drain: the
// pod is left to the rollout, unless the rollout stalled.
func (p *replacePass) replaced(ctx context.Context, g *drain.Group, pod *corev1.Pod, d *appsv1.Deployment, at time.Time) (string, error) {
	name := d.Namespace + "/" + d.Name
	when := at.UTC().Format(time.RFC3339)
	p.r.repl.watch(g.UID)
	if pod.Annotations[ngv1alpha1.RestartedAtAnnotation] == d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation] {
		// One of the restart's own pods: it will not replace itself.
		return fmt.Sprintf("Deployment %s was restarted at %s for this drain, and pod %s is one of its new pods: waiting for the PDB to allow a disruption", name, when, pod.Name), nil
	}
	ro, err := p.rollout(ctx, d, at)
	if err != nil {
		return "", err
	}
	if ro.stalled != "" {
		p.reportStall(g, pod, d, at, ro)
		return fmt.Sprintf("Deployment %s was restarted at %s, but its replacement stalled (%s): waiting for the PDB to allow a disruption", name, when, ro.stalled), nil
	}
	g.Hold(pod)
	if p.unavailable[g.UID] == nil {
		p.unavailable[g.UID] = map[types.UID]int32{}
	}
	_, p.unavailable[g.UID][d.UID] = drain.Fenceposts(d)
	if p.r.once(p.node.UID, "held/"+string(pod.UID)) {
		p.r.event(p.node, corev1.EventTypeNormal, ReasonWaitingForReplacement,
			"pod %s/%s under PDB %s is left to the rollout of Deployment %s, restarted at %s: its controller stops the pod once a replacement is Ready",
			pod.Namespace, pod.Name, g.PDB, name, when)
	}
	if p.pastDeadline {
		return fmt.Sprintf("Deployment %s restarted at %s replaces them, so the drain deadline leaves them to it: %d of %d new pods Ready", name, when, ro.ready, ptr.Deref(d.Spec.Replicas, 1)), nil
	}
	return fmt.Sprintf("Deployment %s restarted at %s replaces them: %d of %d new pods Ready", name, when, ro.ready, ptr.Deref(d.Spec.Replicas, 1)), nil
}

// wait leaves the pod queued: once per pod, a Warning event says why.
func (p *replacePass) wait(g *drain.Group, pod *corev1.Pod, why string) string {
	if p.r.once(p.node.UID, "blocked-wait/"+string(pod.UID)) {
		p.r.event(p.node, corev1.EventTypeWarning, ReasonDrainBlockedByBudget,
			"pod %s/%s is under PDB %s, which allows no disruption although every pod it expects is healthy (%s): nodeguard waits: %s", pod.Namespace, pod.Name, g.PDB, budgetNumbers(g), why)
	}
	return fmt.Sprintf("blocked by design (%s): waiting, %s", budgetNumbers(g), why)
}

// budgetNumbers are a PDB's status numbers, by their field names.
func budgetNumbers(g *drain.Group) string {
	return fmt.Sprintf("currentHealthy %d, desiredHealthy %d, expectedPods %d", g.Healthy, g.Desired, g.Expected)
}

// notGranted tells RBAC's refusal of a patch from other 403s (an admission
// webhook or a policy denying this one patch), which are errors to report.
func notGranted(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot patch resource")
}
