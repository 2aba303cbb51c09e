package webhook_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// TestAdmittedDeleteWarnsOfWhatTheDrainWillMeet deletes, with kubectl, a node
// carrying one pod of each kind a drain waits for or loses, and a node with
// nothing in the way. The first delete is admitted with a warning naming each
// (kubectl prints them), the second with none. The pods, PDB statuses,
// ReplicaSet and Deployment are written as the controllers would have.
func TestAdmittedDeleteWarnsOfWhatTheDrainWillMeet(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	mgr, addr, answers := newManager(t)
	if err := ngwebhook.Register(mgr, ngwebhook.Options{Managed: labels.Everything(), DeleteTimeout: ngwebhook.DefaultDeleteTimeout,
		Rules: doorRules(mgr, nil, nil), WarningsWait: 10 * time.Second,
		Drain: &foresight.Settings{BlockedPDBPolicy: drain.BlockedPDBWait, DaemonSets: drain.DaemonSetsLast}}); err != nil {
		t.Fatal(err)
	}
	useGuards(t, run(t, mgr, addr, answers))
	warnRuns++ // -count=N runs it N times on one cluster
	ns := fmt.Sprintf("warn%d", warnRuns)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	nodes := createReadyNodes(t, ns, 2)
	blocked, clean := nodes[0], nodes[1]
	for _, n := range nodes {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	annotate(t, blocked, ngv1alpha1.DrainTimeoutAnnotation, "30m")

	solo := replicaSetOf(t, ns, "solo", map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "replace"})
	runPod(t, blocked, ns, "web-1", "web", controlledBy("ReplicaSet", "web-rs"))
	runPod(t, blocked, ns, "solo-1", "solo", controlledBy("ReplicaSet", solo.Name))
	runPod(t, blocked, ns, "keep", "keep", controlledBy("ReplicaSet", "keep-rs"), func(p *corev1.Pod) {
		p.Annotations = map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}
	})
	runPod(t, blocked, ns, "scratch", "scratch", withEmptyDir)
	runPod(t, blocked, ns, "both", "shared", controlledBy("ReplicaSet", "shared-rs"))
	budgetWithStatus(t, ns, "web", "web", policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 4, DesiredHealthy: 5, ExpectedPods: 5})
	budgetWithStatus(t, ns, "solo", "solo", policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1})
	for _, name := range []string{"shared-a", "shared-b"} {
		budgetWithStatus(t, ns, name, "shared", policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1, CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2})
	}

	runPod(t, clean, ns, "api-1", "api", controlledBy("ReplicaSet", "api-rs"))
	runPod(t, clean, ns, "proxy-x", "proxy", controlledBy("DaemonSet", "proxy"), withEmptyDir)
	budgetWithStatus(t, ns, "api", "api", policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1, CurrentHealthy: 3, DesiredHealthy: 2, ExpectedPods: 3})

	// The warnings read the API server's watch cache (resourceVersion 0):
	// wait until it has every pod as written.
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := env.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": blocked}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}})
		return err == nil && len(pods.Items) == 5 && slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return len(p.Status.Conditions) == 0 }) < 0, err
	}, "the watch cache has the 5 pods of %s, Ready", blocked)
	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", blocked, "--wait=false")
	if err != nil {
		t.Fatalf("delete of %s: %v\n%s", blocked, err, out)
	}
	for _, want := range []string{
		"Warning: PDB NS/web allows no disruption now (4 healthy, 5 required); pod NS/web-1 on the node: the drain waits until it allows one",
		"Warning: PDB NS/solo allows no disruption now (1 healthy, 1 required); pod NS/solo-1 on the node: it never will by itself; " +
			"nodeguard restarts Deployment NS/solo so they are replaced first (blocked-pdb-policy replace, annotation on Deployment NS/solo)",
		"Warning: pod NS/keep annotated nodeguard.io/do-not-evict=true: the drain waits for it to go on its own",
		"Warning: pod NS/both under more than one PodDisruptionBudget, which the Eviction API refuses",
		"Warning: pod NS/scratch with no controller: once evicted it is gone for good",
		"Warning: pod NS/scratch with emptyDir volumes: its data is lost when it is evicted",
		"Warning: drain deadline 30m0s after the deletion (annotation nodeguard.io/drain-timeout)",
	} {
		want = strings.ReplaceAll(want, "NS/", ns+"/")
		if !strings.Contains(out, want) {
			t.Errorf("kubectl delete node %s printed no %q; it printed:\n%s", blocked, want, out)
		}
	}
	if n := getNode(t, blocked); n.DeletionTimestamp == nil {
		t.Errorf("the warned delete of %s was not admitted", blocked)
	}

	out, err = harness.Kubectl(env.Kubeconfig, "", "delete", "node", clean, "--wait=false")
	if err != nil || strings.Contains(out, "Warning:") {
		t.Errorf("delete of %s, with nothing in its drain's way: %v; want no warning, got:\n%s", clean, err, out)
	}
}

// warnRuns numbers the runs of TestAdmittedDeleteWarnsOfWhatTheDrainWillMeet.
var warnRuns int

func annotate(t *testing.T, node, key, value string) {
	t.Helper()
	patchNode(t, node, func(n *corev1.Node) { n.Annotations = map[string]string{key: value} })
}

// replicaSetOf writes a Deployment (one replica, surging) and its ReplicaSet,
// as the Deployment controller would have.
func replicaSetOf(t *testing.T, ns, name string, annotations map[string]string) *appsv1.ReplicaSet {
	t.Helper()
	d := builder.Deployment(ns, name, 1)
	d.Annotations = annotations
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
		MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
	harness.MustCreate(t, env.Client, d)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-rs", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: d.Spec.Selector, Template: d.Spec.Template},
	}
	harness.MustCreate(t, env.Client, rs)
	return rs
}

func controlledBy(kind, name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: "0d8b2f0e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}
	}
}

func withEmptyDir(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
}

// runPod creates a pod bound to node and writes its status Running and
// Ready, as the kubelet would.
func runPod(t *testing.T, node, ns, name, app string, mods ...func(*corev1.Pod)) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	}
	for _, m := range mods {
		m(p)
	}
	harness.CreateRunningPod(t, env.Client, p)
}

// budgetWithStatus creates a PDB over app with the status the disruption
// controller would have written.
func budgetWithStatus(t *testing.T, ns, name, app string, status policyv1.PodDisruptionBudgetStatus) {
	t.Helper()
	pdb := builder.PDB(ns, app, builder.MinAvailable("1"))
	pdb.Name = name
	harness.CreatePDBWithStatus(t, env.Client, pdb, status)
}
