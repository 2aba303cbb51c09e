package foresight

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

var now = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func pod(name string, mods ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{"app": name},
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: name + "-rs", Controller: ptr.To(true), APIVersion: "apps/v1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	for _, m := range mods {
		m(&p)
	}
	return p
}

func labelled(app string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Labels["app"] = app } }
func bare(p *corev1.Pod)                    { p.OwnerReferences = nil }
func emptyDir(p *corev1.Pod) {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
}
func doNotEvict(p *corev1.Pod) {
	p.Annotations = map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}
}
func daemon(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "proxy", Controller: ptr.To(true), APIVersion: "apps/v1"}}
}

// pdb selects app; allowed, healthy, desired and expected are its status.
func pdb(name, app string, allowed, healthy, desired, expected int32) policyv1.PodDisruptionBudget {
	return policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID(name)},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: expected},
	}
}

func deployment(name string, replicas int32, annotations map[string]string) *appsv1.Deployment {
	one := intstr.FromInt32(1)
	zero := intstr.FromInt32(0)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Strategy: appsv1.DeploymentStrategy{
			Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &one, MaxUnavailable: &zero}}},
	}
}

func node(annotations map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: annotations}}
}

func byKind(found []Finding) map[Kind]Finding {
	out := map[Kind]Finding{}
	for _, f := range found {
		out[f.Kind] = f
	}
	return out
}

func TestACleanNodeGetsNoFinding(t *testing.T) {
	pods := []corev1.Pod{
		pod("web-1", labelled("web")), pod("web-2", labelled("web")),
		pod("proxy-x", daemon, emptyDir), // per node: comes back on the next
		pod("done", bare, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
	}
	pdbs := []policyv1.PodDisruptionBudget{pdb("web", "web", 1, 5, 4, 5)}
	found, err := Foresee(context.Background(), node(nil), pods, pdbs, nil, Settings{DaemonSets: drain.DaemonSetsLast, DrainTimeout: time.Hour}, nil, now)
	if err != nil || len(found) != 0 {
		t.Fatalf("Foresee = %+v, %v; want nothing on a node whose PDBs allow a disruption", found, err)
	}
}

func TestEveryBlockerIsNamed(t *testing.T) {
	pods := []corev1.Pod{
		pod("web-1", labelled("web")),             // PDB allows none, not by design
		pod("solo-1", labelled("solo")),           // blocked by design, a Deployment that can be replaced
		pod("db-0", labelled("db")),               // blocked by design, no Deployment
		pod("keep", doNotEvict),                   // do-not-evict
		pod("scratch", bare, emptyDir),            // lost twice over
		pod("both", labelled("shared"), emptyDir), // under two PDBs
		pod("crit", func(p *corev1.Pod) { p.Spec.PriorityClassName = "system-node-critical" }, labelled("crit")),
	}
	pods[2].OwnerReferences[0].Kind = "StatefulSet"
	pdbs := []policyv1.PodDisruptionBudget{
		pdb("web", "web", 0, 4, 5, 5),
		pdb("solo", "solo", 0, 1, 1, 1),
		pdb("db", "db", 0, 3, 3, 3),
		pdb("shared-a", "shared", 1, 2, 1, 2), pdb("shared-b", "shared", 1, 2, 1, 2),
		pdb("crit", "crit", 0, 1, 1, 1),
	}
	deployments := map[string]*appsv1.Deployment{"solo-1-rs": deployment("solo", 1, nil)}
	deploymentOf := func(_ context.Context, p *corev1.Pod) (*appsv1.Deployment, error) {
		return deployments[p.OwnerReferences[0].Name], nil
	}
	n := node(map[string]string{ngv1alpha1.DrainTimeoutAnnotation: "30m"})
	found, err := Foresee(context.Background(), n, pods, pdbs, nil, Settings{BlockedPDBPolicy: drain.BlockedPDBReplace, DaemonSets: drain.DaemonSetsLast}, deploymentOf, now)
	if err != nil {
		t.Fatal(err)
	}
	var blocked []string
	for _, f := range found {
		if f.Kind == BlockedPDB {
			blocked = append(blocked, f.Message)
		}
		if len(f.Message) > maxMessage {
			t.Errorf("%s: %d characters, more than an admission warning keeps: %q", f.Kind, len(f.Message), f.Message)
		}
	}
	for _, want := range []string{
		"PDB shop/web allows no disruption now (4 healthy, 5 required); pod shop/web-1 on the node: the drain waits until it allows one",
		"PDB shop/solo allows no disruption now (1 healthy, 1 required); pod shop/solo-1 on the node: it never will by itself; nodeguard restarts Deployment shop/solo so they are replaced first (blocked-pdb-policy replace, --blocked-pdb-policy)",
		"PDB shop/db allows no disruption now (3 healthy, 3 required); pod shop/db-0 on the node: it never will by itself; the drain waits (only Deployments are restarted)",
		"PDB shop/crit allows no disruption now", // a later tier's PDB too
	} {
		if !containsPrefix(blocked, want) {
			t.Errorf("no blocked-PDB finding %q in\n%s", want, strings.Join(blocked, "\n"))
		}
	}
	k := byKind(found)
	for kind, want := range map[Kind]string{
		DoNotEvict:   "pod shop/keep annotated nodeguard.io/do-not-evict=true: the drain waits for it to go on its own",
		MultiplePDBs: "pod shop/both under more than one PodDisruptionBudget",
		NoController: "pod shop/scratch with no controller: once evicted it is gone for good",
		EmptyDir:     "2 pods (shop/both, shop/scratch) with emptyDir volumes: their data is lost when they are evicted",
		Deadline:     "drain deadline 30m0s after the deletion (annotation nodeguard.io/drain-timeout)",
	} {
		if !strings.HasPrefix(k[kind].Message, want) {
			t.Errorf("%s finding = %q, want it to start %q", kind, k[kind].Message, want)
		}
	}
	if got := found[len(found)-1].Kind; got != Deadline {
		t.Errorf("last finding is %s; the deadline, which ends every wait, comes last", got)
	}
}

func TestTheBlockedPDBPolicyIsResolvedAsTheDrainDoes(t *testing.T) {
	pods := []corev1.Pod{pod("solo-1", labelled("solo"))}
	pdbs := []policyv1.PodDisruptionBudget{pdb("solo", "solo", 0, 1, 1, 1)}
	for _, tc := range []struct {
		name   string
		global drain.BlockedPDBPolicy
		d      *appsv1.Deployment
		want   string
	}{
		{"the flag waits", drain.BlockedPDBWait, deployment("solo", 1, nil), "the drain waits (blocked-pdb-policy wait, --blocked-pdb-policy)"},
		{"the Deployment's annotation replaces", drain.BlockedPDBWait,
			deployment("solo", 1, map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "replace"}),
			"nodeguard restarts Deployment shop/solo so they are replaced first (blocked-pdb-policy replace, annotation on Deployment shop/solo)"},
		{"a Deployment that cannot surge waits", drain.BlockedPDBReplace,
			func() *appsv1.Deployment {
				d := deployment("solo", 1, nil)
				d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
				return d
			}(), "the drain waits: Deployment shop/solo uses the Recreate strategy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found, err := Foresee(context.Background(), node(nil), pods, pdbs, nil, Settings{BlockedPDBPolicy: tc.global},
				func(context.Context, *corev1.Pod) (*appsv1.Deployment, error) { return tc.d, nil }, now)
			if err != nil || len(found) != 2 || found[0].Kind != BlockedPDB || found[1].Kind != Deadline {
				t.Fatalf("Foresee = %+v, %v; want the blocked PDB, then no deadline", found, err)
			}
			if !strings.Contains(found[0].Message, tc.want) {
				t.Errorf("finding = %q, want %q", found[0].Message, tc.want)
			}
			if replaced := strings.Contains(tc.want, "nodeguard restarts"); found[0].Replaced != replaced || found[0].PDB != "shop/solo" {
				t.Errorf("finding of PDB %q says replaced %v, want PDB shop/solo, %v", found[0].PDB, found[0].Replaced, replaced)
			}
			if want := "no drain deadline (--drain-timeout 0)"; !strings.HasPrefix(found[1].Message, want) {
				t.Errorf("deadline finding = %q, want %q", found[1].Message, want)
			}
		})
	}
}

func TestManyPodsAreCountedNotAllNamed(t *testing.T) {
	var pods []corev1.Pod
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		pods = append(pods, pod(name, bare))
	}
	found, err := Foresee(context.Background(), node(nil), pods, nil, nil, Settings{}, nil, now)
	if err != nil || len(found) != 1 {
		t.Fatalf("Foresee = %+v, %v", found, err)
	}
	if want := "5 pods (shop/a, shop/b, shop/c and 2 more) with no controller"; !strings.HasPrefix(found[0].Message, want) || len(found[0].Pods) != 5 {
		t.Errorf("finding = %q naming %v, want %q and all five pods", found[0].Message, found[0].Pods, want)
	}
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// TestABudgetsDrainTimeoutBringsTheDeadlineCloser: the deadline a waiting
// drain meets is the shortest of the node's own and its budgets', named by
// where it comes from; a budget of other nodes has no say.
func TestABudgetsDrainTimeoutBringsTheDeadlineCloser(t *testing.T) {
	pods := []corev1.Pod{pod("keep", doNotEvict)}
	n := node(map[string]string{ngv1alpha1.DrainTimeoutAnnotation: "30m"})
	n.Labels = map[string]string{"pool": "user"}
	ndb := func(name, pool string, timeout time.Duration) ngv1alpha1.NodeDisruptionBudget {
		return ngv1alpha1.NodeDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: ngv1alpha1.NodeDisruptionBudgetSpec{
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}},
			DrainTimeout: &metav1.Duration{Duration: timeout}}}
	}
	ndbs := []ngv1alpha1.NodeDisruptionBudget{ndb("user", "user", 10*time.Minute), ndb("system", "system", time.Minute)}
	found, err := Foresee(context.Background(), n, pods, nil, ndbs, Settings{DrainTimeout: time.Hour}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	want := `drain deadline 10m0s after the deletion (NodeDisruptionBudget "user" drainTimeout)`
	if got := byKind(found)[Deadline].Message; !strings.HasPrefix(got, want) {
		t.Errorf("deadline finding = %q, want it to start %q", got, want)
	}
}
