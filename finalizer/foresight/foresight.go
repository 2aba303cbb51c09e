// Package foresight says what a node's drain will run into before it starts:
// pods whose PodDisruptionBudget allows no eviction now (and whether nodeguard
// will replace them first or wait), pods annotated do-not-evict, pods under
// several PDBs, pods that will be lost (no controller, emptyDir data) and the
// drain deadline that ends the wait. It reads the same plan the drain does
// (finalizer/drain), so what it foresees is what the drain meets.
package foresight

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// Kind names what a finding is about (a metric label).
type Kind string

const (
	// BlockedPDB: pods under a PDB that allows no disruption now.
	BlockedPDB Kind = "blocked_pdb"
	// DoNotEvict: pods annotated nodeguard.io/do-not-evict=true.
	DoNotEvict Kind = "do_not_evict"
	// MultiplePDBs: pods under more than one PDB, which the Eviction API refuses.
	MultiplePDBs Kind = "multiple_pdbs"
	// NoController: pods no controller recreates once evicted.
	NoController Kind = "no_controller"
	// EmptyDir: pods whose emptyDir volumes are lost with them.
	EmptyDir Kind = "emptydir"
	// Deadline: the drain deadline that ends the waits above.
	Deadline Kind = "drain_deadline"
)

// Kinds are every kind, in the order findings come.
var Kinds = []Kind{BlockedPDB, DoNotEvict, MultiplePDBs, NoController, EmptyDir, Deadline}

// Finding is one thing the drain will meet, said in one line.
type Finding struct {
	Kind Kind
	// Pods are the pods concerned, namespace/name.
	Pods []string
	// Message says it, at most maxMessage characters.
	Message string
	// PDB is the blocked PDB (BlockedPDB only), and Replaced whether
	// nodeguard restarts its Deployment first rather than wait.
	PDB      string
	Replaced bool
}

// maxMessage keeps a finding within what kube-apiserver passes on of an
// admission warning (longer ones may be truncated).
const maxMessage = 256

// maxNamed is how many pods a message names before "and N more".
const maxNamed = 3

// Settings are the drain's own settings, as the finalizer has them.
type Settings struct {
	// BlockedPDBPolicy is --blocked-pdb-policy.
	BlockedPDBPolicy drain.BlockedPDBPolicy
	// DrainTimeout is --drain-timeout (0: none).
	DrainTimeout time.Duration
	// DaemonSets is --daemonset-pods.
	DaemonSets drain.DaemonSetPolicy
}

// DeploymentOf finds a pod's Deployment (nil if it has none).
type DeploymentOf func(ctx context.Context, pod *corev1.Pod) (*appsv1.Deployment, error)

// Foresee reads a node's pods and the PDBs of their namespaces as a drain
// starting now would, and returns what it will meet, in the order of Kinds.
// A node with nothing in the way gets none. ndbs are the
// NodeDisruptionBudgets (all of them, or those that select the node): their
// drainTimeout may bring the deadline closer (drain.Timeout).
func Foresee(ctx context.Context, node *corev1.Node, pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, ndbs []ngv1alpha1.NodeDisruptionBudget, s Settings, deploymentOf DeploymentOf, now time.Time) ([]Finding, error) {
	plans, err := Plans(pods, pdbs, s, now)
	if err != nil {
		return nil, err
	}
	return FromPlans(ctx, node, plans, ndbs, s, deploymentOf), nil
}

// FromPlans is Foresee over plans already made (Plans).
func FromPlans(ctx context.Context, node *corev1.Node, plans []*drain.Plan, ndbs []ngv1alpha1.NodeDisruptionBudget, s Settings, deploymentOf DeploymentOf) []Finding {
	var f []Finding
	for _, p := range plans {
		for i := range p.Groups {
			if g := &p.Groups[i]; g.Blocked {
				f = append(f, blockedFinding(ctx, g, s, deploymentOf))
			}
		}
	}
	var doNotEvict, multiple, evicted []*corev1.Pod
	for _, p := range plans {
		doNotEvict = append(doNotEvict, p.DoNotEvict...)
		multiple = append(multiple, p.MultiplePDBs...)
		evicted = append(evicted, p.Unprotected...)
		for _, g := range p.Groups {
			evicted = append(evicted, g.Pods...)
		}
	}
	if len(doNotEvict) > 0 {
		f = append(f, finding(DoNotEvict, doNotEvict, func(one bool) string {
			return fmt.Sprintf("annotated %s=true: the drain waits for %s", ngv1alpha1.DoNotEvictAnnotation, either(one, "it to go on its own", "them to go on their own"))
		}))
	}
	if len(multiple) > 0 {
		f = append(f, finding(MultiplePDBs, multiple, func(one bool) string {
			return fmt.Sprintf("under more than one PodDisruptionBudget, which the Eviction API refuses: the drain waits for %s (fix the overlapping PDBs)", either(one, "it", "them"))
		}))
	}
	waits := len(f) > 0
	// What the drain removes, by eviction or at the deadline; DaemonSet pods
	// are per node, and come back on the next.
	removed := filter(slices.Concat(evicted, doNotEvict, multiple), func(p *corev1.Pod) bool { return !ownedBy(p, "DaemonSet") })
	if bare := filter(removed, func(p *corev1.Pod) bool { return metav1.GetControllerOf(p) == nil }); len(bare) > 0 {
		f = append(f, finding(NoController, bare, func(one bool) string {
			return "with no controller: " + either(one, "once evicted it is gone for good", "once evicted they are gone for good")
		}))
	}
	if data := filter(removed, hasEmptyDir); len(data) > 0 {
		f = append(f, finding(EmptyDir, data, func(one bool) string {
			return "with emptyDir volumes: " + either(one, "its data is lost when it is evicted", "their data is lost when they are evicted")
		}))
	}
	if d, ok := deadline(node, ndbs, s, waits); ok {
		f = append(f, d)
	}
	return f
}

// Plans plans a drain starting now tier by tier (drain.NewPlan groups the
// first tier with pods left; the next plan takes the rest).
func Plans(pods []corev1.Pod, pdbs []policyv1.PodDisruptionBudget, s Settings, now time.Time) ([]*drain.Plan, error) {
	var plans []*drain.Plan
	for len(pods) > 0 {
		p, err := drain.NewPlan(pods, pdbs, drain.PlanOptions{DaemonSets: s.DaemonSets, Now: now})
		if err != nil {
			return nil, err
		}
		plans = append(plans, p)
		if len(p.Later) == len(pods) { // nothing planned: never loop
			break
		}
		next := make([]corev1.Pod, 0, len(p.Later))
		for _, pod := range p.Later {
			next = append(next, *pod)
		}
		pods = next
	}
	return plans, nil
}

// blockedFinding says what the drain does about a PDB that allows no
// disruption now: wait for it, or, blocked by design under the replace
// policy, restart the pods' Deployment first.
func blockedFinding(ctx context.Context, g *drain.Group, s Settings, deploymentOf DeploymentOf) Finding {
	pdb := g.PDB.String()
	what := fmt.Sprintf("PDB %s allows no disruption now (%d healthy, %d required)", pdb, g.Healthy, g.Desired)
	then, replaced := "the drain waits until it allows one", false
	if g.ByDesign {
		var how string
		how, replaced = replaceOrWait(ctx, g, s, deploymentOf)
		then = "it never will by itself; " + how
	}
	return Finding{Kind: BlockedPDB, Pods: names(g.Pods), PDB: pdb, Replaced: replaced,
		Message: fit(fmt.Sprintf("%s; %s on the node: %s", what, podList(g.Pods), then))}
}

// replaceOrWait says whether the drain restarts the group's Deployment or
// waits, as the finalizer decides (finalizer/replacement.go).
func replaceOrWait(ctx context.Context, g *drain.Group, s Settings, deploymentOf DeploymentOf) (how string, replaced bool) {
	var d *appsv1.Deployment
	if deploymentOf != nil {
		var err error
		if d, err = deploymentOf(ctx, g.Pods[0]); err != nil {
			return fmt.Sprintf("the drain waits (%v)", err), false
		}
	}
	if d == nil {
		return "the drain waits (only Deployments are restarted); scale up or relax the PDB", false
	}
	policy, source, err := drain.PolicyFor(d, g.Budget, s.BlockedPDBPolicy)
	switch {
	case err != nil:
		return fmt.Sprintf("the drain waits (%v)", err), false
	case policy == drain.BlockedPDBWait:
		return fmt.Sprintf("the drain waits (blocked-pdb-policy wait, %s)", source), false
	}
	if ok, why := drain.CanReplace(d, g.Healthy, g.Desired, 0); !ok {
		return "the drain waits: " + why, false
	}
	return fmt.Sprintf("nodeguard restarts Deployment %s/%s so they are replaced first (blocked-pdb-policy replace, %s)", d.Namespace, d.Name, source), true
}

// deadline says when the drain stops waiting, if anything makes it wait.
func deadline(node *corev1.Node, ndbs []ngv1alpha1.NodeDisruptionBudget, s Settings, waits bool) (Finding, bool) {
	timeout, source, err := drain.Timeout(node, s.DrainTimeout, ndbs)
	switch {
	case err != nil:
		return Finding{Kind: Deadline, Message: fit(err.Error())}, true
	case !waits:
		return Finding{}, false
	case timeout <= 0:
		return Finding{Kind: Deadline, Message: fmt.Sprintf("no drain deadline (%s 0): the node stays until the pods above go; no NodeDisruptionBudget of it sets a drainTimeout", source)}, true
	}
	return Finding{Kind: Deadline, Message: fmt.Sprintf("drain deadline %s after the deletion (%s): the pods left then are deleted without regard to PDBs or do-not-evict",
		timeout, source)}, true
}

// finding words pods of one kind: say tells what happens to them, in the
// singular when one is true.
func finding(kind Kind, pods []*corev1.Pod, say func(one bool) string) Finding {
	return Finding{Kind: kind, Pods: names(pods), Message: fit(podList(pods) + " " + say(len(pods) == 1))}
}

// either picks the singular or the plural wording.
func either(one bool, singular, plural string) string {
	if one {
		return singular
	}
	return plural
}

// podList names up to maxNamed pods: "pod a/b", "2 pods (a/b, a/c)", "5 pods
// (a/b, a/c, a/d and 2 more)".
func podList(pods []*corev1.Pod) string {
	n := names(pods)
	if len(n) == 1 {
		return "pod " + n[0]
	}
	shown := strings.Join(n[:min(len(n), maxNamed)], ", ")
	if len(n) > maxNamed {
		shown += fmt.Sprintf(" and %d more", len(n)-maxNamed)
	}
	return fmt.Sprintf("%d pods (%s)", len(n), shown)
}

func names(pods []*corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func filter(pods []*corev1.Pod, keep func(*corev1.Pod) bool) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

func ownedBy(pod *corev1.Pod, kind string) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == kind
}

func hasEmptyDir(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.EmptyDir != nil })
}

// fit cuts a message to maxMessage characters.
func fit(msg string) string {
	if len(msg) <= maxMessage {
		return msg
	}
	return msg[:maxMessage-3] + "..."
}

// DeploymentsFrom finds a pod's Deployment through its ReplicaSet with r:
// nil when the pod has no ReplicaSet, the ReplicaSet no Deployment, or
// either is gone.
func DeploymentsFrom(r client.Reader) DeploymentOf {
	return func(ctx context.Context, pod *corev1.Pod) (*appsv1.Deployment, error) {
		ref := metav1.GetControllerOf(pod)
		if ref == nil || ref.Kind != "ReplicaSet" {
			return nil, nil
		}
		var rs appsv1.ReplicaSet
		if err := r.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &rs); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		if ref = metav1.GetControllerOf(&rs); ref == nil || ref.Kind != "Deployment" {
			return nil, nil
		}
		var d appsv1.Deployment
		if err := r.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &d); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		return &d, nil
	}
}
