// Package drain evicts a node's pods through the Eviction API, serially per
// PodDisruptionBudget: each PDB is one queue with at most one eviction request
// in flight, process-wide. That closes the one way the Eviction API can
// over-disrupt (concurrent evictions under one PDB reaching different API
// servers), and after a 200 the next eviction goes at once, because the API
// server charged the PDB inside that request.
package drain

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// mirrorPodAnnotation marks static pods' mirrors, which the API cannot evict.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// DaemonSetPolicy says what happens to DaemonSet pods.
type DaemonSetPolicy string

const (
	// DaemonSetsLast evicts DaemonSet pods once, after every other pod is
	// gone; the replacements their controller puts back are ignored.
	DaemonSetsLast DaemonSetPolicy = "last"
	// DaemonSetsSkip leaves DaemonSet pods on the node.
	DaemonSetsSkip DaemonSetPolicy = "skip"
)

// PlanOptions are what, besides the pods and PDBs, decides a drain pass.
type PlanOptions struct {
	DaemonSets DaemonSetPolicy
	// Now is the time of the pass.
	Now time.Time
	// NodeDeleted is when the node's deletion began: pods that would come
	// straight back and were created after it are replacements, never evicted.
	NodeDeleted time.Time
	// EvictedControllers are the controllers with a pod already evicted from
	// the node (Evictor.EvictedControllers). Both times have whole seconds: a
	// pod created in the second of the deletion is a replacement only if its
	// controller is one of these, else it may be the original.
	EvictedControllers map[types.UID]bool
	// StuckMargin is how long past its grace period a terminating pod is
	// waited for.
	StuckMargin time.Duration
	// Unreachable means no kubelet will confirm a pod's deletion (the node's
	// Ready condition is Unknown, or it carries the out-of-service taint):
	// terminating pods are waited for only UnreachableMargin.
	Unreachable bool
	// PastDeadline means the drain deadline has passed: terminating pods are
	// no longer waited for.
	PastDeadline bool
}

// UnreachableMargin is how long a terminating pod of an unreachable node is
// waited for: long enough for a deletion the API server finishes by itself
// (a pod never started), not for a kubelet that is gone.
const UnreachableMargin = 5 * time.Second

// Tier orders evictions: each tier is finished before the next starts, so
// that the node's system services (logs, metrics, network) outlive the
// workloads (Karpenter's order).
type Tier int

const (
	// TierOrdinary is every pod not in a later tier.
	TierOrdinary Tier = iota
	// TierCritical is system-cluster-critical and system-node-critical pods.
	TierCritical
	// TierReturning is DaemonSet pods and pods that tolerate the draining and
	// unschedulable taints: evicted, they would come straight back, so they go
	// once, last, and their replacements are ignored.
	TierReturning
)

func (t Tier) String() string {
	return [...]string{"ordinary", "system-critical", "DaemonSet or returning"}[t]
}

// Plan sorts a node's pods for one drain pass.
type Plan struct {
	// Tier is the tier this pass evicts.
	Tier Tier
	// Groups are the tier's evictable pods under exactly one PDB, per PDB.
	Groups []Group
	// Unprotected are the tier's evictable pods under no PDB.
	Unprotected []*corev1.Pod
	// MultiplePDBs are pods under more than one PDB: the Eviction API refuses them.
	MultiplePDBs []*corev1.Pod
	// DoNotEvict are pods annotated nodeguard.io/do-not-evict: the drain waits for them.
	DoNotEvict []*corev1.Pod
	// Terminating are pods already being deleted: the drain waits for them to go.
	Terminating []*corev1.Pod
	// Later are pods of later tiers, evicted once this tier is done.
	Later []*corev1.Pod
	// GivenUp are terminating pods the drain no longer waits for, with why.
	GivenUp []GivenUp
	// WakeMark is Evictor.Mark taken before the PDBs were read: a queue the
	// plan found blocked goes on at once if its PDB allowed a disruption since.
	WakeMark uint64
}

// GivenUp is a terminating pod that no longer holds the node.
type GivenUp struct {
	Pod *corev1.Pod
	// Cause is GiveUpStuck, GiveUpUnreachable or GiveUpDeadline (a metric label).
	Cause string
	// Reason says why in words.
	Reason string
}

// Causes of giving up on a terminating pod, as metric label values.
const (
	GiveUpStuck       = "stuck"
	GiveUpUnreachable = "unreachable"
	GiveUpDeadline    = "deadline"
)

// Group is the evictable pods under one PDB, those not Ready first: the
// Eviction API may let them go even when the PDB allows no disruption.
type Group struct {
	PDB  types.NamespacedName
	UID  types.UID
	Pods []*corev1.Pod
	// Blocked is true when the PDB's current status allows no disruption and
	// every pod is Ready: an eviction now would certainly be refused (429),
	// so the queue waits for the PDB's status to change without sending one.
	Blocked bool
	// ByDesign is true when the queue is Blocked although every pod the PDB
	// counts is healthy and none is being disrupted: the PDB will never allow
	// a disruption by itself (one replica under minAvailable: 1, N under
	// minAvailable: N or maxUnavailable: 0).
	ByDesign bool
	// Allowed, Healthy, Desired and Expected are the PDB's disruptionsAllowed,
	// currentHealthy, desiredHealthy and expectedPods as last computed.
	Allowed, Healthy, Desired, Expected int32
	// Budget is the PDB itself.
	Budget *policyv1.PodDisruptionBudget
	// Replacing are pods taken out of the queue (Hold) because their
	// Deployment's rollout replaces them: they are never evicted, nor deleted
	// at the drain deadline; their controller stops them.
	Replacing []*corev1.Pod
	// Note says what nodeguard does about the queue beyond evicting, for the
	// node condition (e.g. a replacement in progress).
	Note string
}

// Hold takes a pod out of the queue into Replacing.
func (g *Group) Hold(pod *corev1.Pod) {
	if i := slices.Index(g.Pods, pod); i >= 0 {
		g.Pods = slices.Delete(g.Pods, i, i+1)
		g.Replacing = append(g.Replacing, pod)
	}
}

// Remaining counts the pods the drain still waits for.
func (p *Plan) Remaining() int {
	n := len(p.Unprotected) + len(p.MultiplePDBs) + len(p.DoNotEvict) + len(p.Terminating) + len(p.Later)
	for _, g := range p.Groups {
		n += len(g.Pods) + len(g.Replacing)
	}
	return n
}

// NewPlan sorts pods: mirror pods, finished pods and replacements are ignored;
// terminating pods stuck past their grace period are given up on; the rest
// are sorted into tiers, and only the first tier with pods left is worked on,
// its evictable pods grouped by the PDB that selects them. Pods are taken in
// namespace/name order, whatever order they come in (a watch's store has
// none): every pass plans the same queues, and a parked queue is the one the
// next pass would send.
func NewPlan(pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, o PlanOptions) (*Plan, error) {
	plan := &Plan{Tier: TierReturning}
	pending := map[Tier][]*corev1.Pod{}
	for _, pod := range byName(pods) {
		if ignored(pod, o) {
			continue
		}
		if pod.DeletionTimestamp != nil {
			if cause, why := giveUpReason(pod, o); cause != "" {
				plan.GivenUp = append(plan.GivenUp, GivenUp{Pod: pod, Cause: cause, Reason: why})
				continue
			}
		}
		pending[tierOf(pod)] = append(pending[tierOf(pod)], pod)
	}
	for _, t := range []Tier{TierOrdinary, TierCritical, TierReturning} {
		if len(pending[t]) > 0 {
			plan.Tier = t
			break
		}
	}
	var evictable []*corev1.Pod
	for t, tierPods := range pending {
		if t != plan.Tier {
			plan.Later = append(plan.Later, tierPods...)
			continue
		}
		for _, pod := range tierPods {
			switch {
			case pod.DeletionTimestamp != nil:
				plan.Terminating = append(plan.Terminating, pod)
			case pod.Annotations[ngv1alpha1.DoNotEvictAnnotation] == "true":
				plan.DoNotEvict = append(plan.DoNotEvict, pod)
			default:
				evictable = append(evictable, pod)
			}
		}
	}
	return plan, plan.group(evictable, pdbs)
}

// byName points at the pods in namespace/name order.
func byName(pods []corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, len(pods))
	for i := range pods {
		out[i] = &pods[i]
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// NeverWaitedFor reports whether no drain waits for the pod, whatever the
// options: a mirror pod or a finished pod.
func NeverWaitedFor(pod *corev1.Pod) bool {
	return pod.Annotations[mirrorPodAnnotation] != "" || isFinished(pod)
}

// ignored are the pods a drain never touches: mirror pods, finished pods,
// DaemonSet pods under DaemonSetsSkip, and replacements of returning pods.
func ignored(pod *corev1.Pod, o PlanOptions) bool {
	switch {
	case NeverWaitedFor(pod):
		return true
	case isDaemonSetPod(pod) && o.DaemonSets == DaemonSetsSkip:
		return true
	case tierOf(pod) == TierReturning && isReplacement(pod, o):
		// Its controller put it back once the node was deleting: evicting it
		// again would loop.
		return true
	}
	return false
}

// isReplacement reports whether a returning pod was put back by its
// controller after the node began deleting. A pod no controller manages is
// never a replacement.
func isReplacement(pod *corev1.Pod, o PlanOptions) bool {
	owner := metav1.GetControllerOf(pod)
	if owner == nil || o.NodeDeleted.IsZero() {
		return false
	}
	switch created := pod.CreationTimestamp.Time; {
	case created.Before(o.NodeDeleted):
		return false
	case created.Equal(o.NodeDeleted):
		return o.EvictedControllers[owner.UID]
	}
	return true
}

// giveUpReason says why a terminating pod no longer holds the node, or "".
func giveUpReason(pod *corev1.Pod, o PlanOptions) (cause, why string) {
	// The API server sets deletionTimestamp to when the grace period ends.
	grace := time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 0)) * time.Second
	terminating := o.Now.Sub(pod.DeletionTimestamp.Add(-grace))
	switch {
	case o.PastDeadline:
		return GiveUpDeadline, "the drain deadline passed"
	case o.Unreachable && terminating >= UnreachableMargin:
		return GiveUpUnreachable, "the node is unreachable, so no kubelet will confirm the deletion"
	case o.StuckMargin > 0 && terminating >= grace+o.StuckMargin:
		return GiveUpStuck, fmt.Sprintf("terminating for %s, past its grace period (%s) plus %s", terminating.Round(time.Second), grace, o.StuckMargin)
	}
	return "", ""
}

// tierOf puts a pod in its eviction tier.
func tierOf(pod *corev1.Pod) Tier {
	switch {
	case isDaemonSetPod(pod) || comesBack(pod):
		return TierReturning
	case pod.Spec.PriorityClassName == "system-cluster-critical" || pod.Spec.PriorityClassName == "system-node-critical":
		return TierCritical
	}
	return TierOrdinary
}

// comesBack reports whether the pod tolerates both the draining taint and the
// unschedulable taint: the scheduler would put its replacement right back.
func comesBack(pod *corev1.Pod) bool {
	draining := corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule}
	cordoned := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	return tolerates(pod, &draining) && tolerates(pod, &cordoned)
}

func tolerates(pod *corev1.Pod, taint *corev1.Taint) bool {
	for i := range pod.Spec.Tolerations {
		if pod.Spec.Tolerations[i].ToleratesTaint(klog.Background(), taint, false) {
			return true
		}
	}
	return false
}

func (p *Plan) group(pods []*corev1.Pod, pdbs []policyv1.PodDisruptionBudget) error {
	groups := map[types.UID]*Group{}
	selectors := make([]labels.Selector, len(pdbs))
	for _, pod := range pods {
		matching, err := matchingPDBs(pod, pdbs, selectors)
		if err != nil {
			return err
		}
		switch len(matching) {
		case 0:
			p.Unprotected = append(p.Unprotected, pod)
		case 1:
			pdb := matching[0]
			g, ok := groups[pdb.UID]
			if !ok {
				g = &Group{PDB: types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}, UID: pdb.UID}
				groups[pdb.UID] = g
			}
			g.Pods = append(g.Pods, pod)
		default:
			p.MultiplePDBs = append(p.MultiplePDBs, pod)
		}
	}
	for _, g := range groups {
		sort.SliceStable(g.Pods, func(i, j int) bool { return !PodReady(g.Pods[i]) && PodReady(g.Pods[j]) })
		pdb := pdbByUID(pdbs, g.UID)
		g.Blocked = blocked(pdb, g.Pods)
		if pdb != nil {
			g.Budget = pdb
			g.Allowed, g.Healthy = pdb.Status.DisruptionsAllowed, pdb.Status.CurrentHealthy
			g.Desired, g.Expected = pdb.Status.DesiredHealthy, pdb.Status.ExpectedPods
			g.ByDesign = g.Blocked && blockedByDesign(pdb)
		}
		p.Groups = append(p.Groups, *g)
	}
	sort.Slice(p.Groups, func(i, j int) bool { return p.Groups[i].PDB.String() < p.Groups[j].PDB.String() })
	return nil
}

// matchingPDBs returns the PDBs of the pod's namespace whose selector matches
// it. As in the Eviction API, a nil selector matches nothing and an empty one
// every pod. selectors[i] keeps pdbs[i]'s selector, converted on first use:
// a plan matches every pod of the node against the same PDBs.
func matchingPDBs(pod *corev1.Pod, pdbs []policyv1.PodDisruptionBudget, selectors []labels.Selector) ([]*policyv1.PodDisruptionBudget, error) {
	var out []*policyv1.PodDisruptionBudget
	for i := range pdbs {
		pdb := &pdbs[i]
		if pdb.Namespace != pod.Namespace || pdb.Spec.Selector == nil {
			continue
		}
		if selectors[i] == nil {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil {
				return nil, fmt.Errorf("PodDisruptionBudget %s/%s has an invalid selector: %w", pdb.Namespace, pdb.Name, err)
			}
			selectors[i] = sel
		}
		if selectors[i].Matches(labels.Set(pod.Labels)) {
			out = append(out, pdb)
		}
	}
	return out, nil
}

// blocked reports whether the PDB's status, computed for its current spec,
// allows no disruption while every pod in the queue is Ready.
func blocked(pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod) bool {
	if pdb == nil || pdb.Status.ObservedGeneration < pdb.Generation || pdb.Status.DisruptionsAllowed > 0 {
		return false
	}
	for _, pod := range pods {
		if !PodReady(pod) {
			return false
		}
	}
	return true
}

// blockedByDesign reports whether a PDB that allows no disruption is healthy
// (currentHealthy >= desiredHealthy) with every pod it expects healthy and
// none being disrupted: no disruption in progress will end and free one.
func blockedByDesign(pdb *policyv1.PodDisruptionBudget) bool {
	s := pdb.Status
	return s.ExpectedPods > 0 && s.CurrentHealthy >= s.DesiredHealthy && s.CurrentHealthy >= s.ExpectedPods && len(s.DisruptedPods) == 0
}

func pdbByUID(pdbs []policyv1.PodDisruptionBudget, uid types.UID) *policyv1.PodDisruptionBudget {
	for i := range pdbs {
		if pdbs[i].UID == uid {
			return &pdbs[i]
		}
	}
	return nil
}

// PodReady reports whether the pod's Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func isFinished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func isDaemonSetPod(pod *corev1.Pod) bool {
	owner := metav1.GetControllerOf(pod)
	return owner != nil && owner.Kind == "DaemonSet" && owner.APIVersion == appsv1.SchemeGroupVersion.String()
}
