// Package drain evicts a node's pods through the Eviction API, serially per
// PodDisruptionBudget: each PDB is one queue with at most one eviction request
// in flight, process-wide. That closes the one way the Eviction API can
// over-disrupt (concurrent evictions under one PDB reaching different API
// servers), and after a 200 the next eviction goes at once, because the API
// server charged the PDB inside that request.
package drain

import (
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// mirrorPodAnnotation marks static pods' mirrors, which the API cannot evict.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// DaemonSetPolicy says what happens to DaemonSet pods.
type DaemonSetPolicy string

const (
	// DaemonSetsLast evicts DaemonSet pods once every other pod is gone.
	DaemonSetsLast DaemonSetPolicy = "last"
	// DaemonSetsSkip leaves DaemonSet pods on the node.
	DaemonSetsSkip DaemonSetPolicy = "skip"
)

// Plan sorts a node's pods for one drain pass.
type Plan struct {
	// Groups are the evictable pods under exactly one PDB, per PDB.
	Groups []Group
	// Unprotected are evictable pods under no PDB.
	Unprotected []*corev1.Pod
	// MultiplePDBs are pods under more than one PDB: the Eviction API refuses them.
	MultiplePDBs []*corev1.Pod
	// DoNotEvict are pods annotated nodeguard.io/do-not-evict: the drain waits for them.
	DoNotEvict []*corev1.Pod
	// Terminating are pods already being deleted: the drain waits for them to go.
	Terminating []*corev1.Pod
	// DaemonSets are DaemonSet pods held back until everything else is gone
	// (with DaemonSetsLast); they are in the groups once that is the case.
	DaemonSets []*corev1.Pod
}

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
}

// Remaining counts the pods the drain still waits for.
func (p *Plan) Remaining() int {
	n := len(p.Unprotected) + len(p.MultiplePDBs) + len(p.DoNotEvict) + len(p.Terminating) + len(p.DaemonSets)
	for _, g := range p.Groups {
		n += len(g.Pods)
	}
	return n
}

// NewPlan sorts pods: mirror pods and finished pods are ignored; DaemonSet pods
// are skipped or held back; the rest are grouped by the PDB that selects them.
func NewPlan(pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, daemonSets DaemonSetPolicy) (*Plan, error) {
	plan := &Plan{}
	var evictable, daemonSetPods []*corev1.Pod
	for i := range pods {
		pod := &pods[i]
		switch {
		case pod.Annotations[mirrorPodAnnotation] != "", isFinished(pod):
			continue
		case pod.DeletionTimestamp != nil:
			plan.Terminating = append(plan.Terminating, pod)
		case pod.Annotations[ngv1alpha1.DoNotEvictAnnotation] == "true":
			plan.DoNotEvict = append(plan.DoNotEvict, pod)
		case isDaemonSetPod(pod):
			if daemonSets != DaemonSetsSkip {
				daemonSetPods = append(daemonSetPods, pod)
			}
		default:
			evictable = append(evictable, pod)
		}
	}
	// DaemonSet pods go last: only once nothing else is left to wait for.
	if len(evictable) == 0 && len(plan.Terminating) == 0 && len(plan.DoNotEvict) == 0 {
		evictable = daemonSetPods
	} else {
		plan.DaemonSets = daemonSetPods
	}
	return plan, plan.group(evictable, pdbs)
}

func (p *Plan) group(pods []*corev1.Pod, pdbs []policyv1.PodDisruptionBudget) error {
	groups := map[types.UID]*Group{}
	for _, pod := range pods {
		matching, err := matchingPDBs(pod, pdbs)
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
		sort.SliceStable(g.Pods, func(i, j int) bool { return !podReady(g.Pods[i]) && podReady(g.Pods[j]) })
		g.Blocked = blocked(pdbByUID(pdbs, g.UID), g.Pods)
		p.Groups = append(p.Groups, *g)
	}
	sort.Slice(p.Groups, func(i, j int) bool { return p.Groups[i].PDB.String() < p.Groups[j].PDB.String() })
	return nil
}

// matchingPDBs returns the PDBs of the pod's namespace whose selector matches
// it. As in the Eviction API, a nil selector matches nothing and an empty one
// every pod.
func matchingPDBs(pod *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) ([]*policyv1.PodDisruptionBudget, error) {
	var out []*policyv1.PodDisruptionBudget
	for i := range pdbs {
		pdb := &pdbs[i]
		if pdb.Namespace != pod.Namespace || pdb.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("PodDisruptionBudget %s/%s has an invalid selector: %w", pdb.Namespace, pdb.Name, err)
		}
		if sel.Matches(labels.Set(pod.Labels)) {
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
		if !podReady(pod) {
			return false
		}
	}
	return true
}

func pdbByUID(pdbs []policyv1.PodDisruptionBudget, uid types.UID) *policyv1.PodDisruptionBudget {
	for i := range pdbs {
		if pdbs[i].UID == uid {
			return &pdbs[i]
		}
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
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
