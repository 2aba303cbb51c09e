package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/plugin"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) { harness.Main(m, harness.Options{}, &env) }

// kubectlNodeguard runs the plugin's command line against the test cluster.
func kubectlNodeguard(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot(&out)
	root.SetErr(&out)
	root.SetArgs(append(args, "--kubeconfig="+env.Kubeconfig))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// readyNodes creates Ready nodes labelled pool=pool, with nodeguard's
// finalizer as its webhook would have added it.
func readyNodes(t *testing.T, pool string, names ...string) {
	t.Helper()
	for _, n := range names {
		harness.MustCreate(t, env.Client, builder.Node(n, builder.Ready(), builder.WithLabels("pool", pool),
			builder.WithFinalizers(ngv1alpha1.TerminationFinalizer)))
	}
}

// budget creates a NodeDisruptionBudget over pool with the status nodeguard's
// status controller would have written: every node available, charged as
// given.
func budget(t *testing.T, pool string, nodes int32, maxUnavailable string, charged map[string]metav1.Time) {
	t.Helper()
	ndb := builder.NDB(pool, builder.NDBSelecting("pool", pool), builder.NDBMaxUnavailable(maxUnavailable))
	harness.MustCreate(t, env.Client, ndb)
	ndb.Status = ngv1alpha1.NodeDisruptionBudgetStatus{ObservedGeneration: ndb.Generation, ExpectedNodes: nodes,
		CurrentAvailable: nodes - int32(len(charged)), DisruptedNodes: charged}
	if err := env.Client.Status().Update(context.Background(), ndb); err != nil {
		t.Fatal(err)
	}
}

// pod creates a Running, Ready pod on node, as the kubelet would report it.
func pod(t *testing.T, node, ns, name, app string, annotations map[string]string, owned bool) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if owned {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-rs",
			UID: "7c1d0f5e-0000-4000-8000-000000000001", Controller: ptr.To(true)}}
	}
	harness.CreateRunningPod(t, env.Client, p)
}

// pdb creates a PDB over app with the status the disruption controller
// would have written.
func pdb(t *testing.T, ns, app string, allowed, healthy, desired, expected int32) {
	t.Helper()
	harness.CreatePDBWithStatus(t, env.Client, builder.PDB(ns, app, builder.MaxUnavailable("1")), policyv1.PodDisruptionBudgetStatus{
		DisruptionsAllowed: allowed, CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: expected})
}

func namespace(t *testing.T, name string) {
	t.Helper()
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// TestPlanOrdersTheNodesAsTheBudgetsAdmitThem plans the removal of three
// nodes under a budget of one at a time: the first goes now, its two pods
// under a PDB allowing one taking one cycle; the second follows once it is
// gone, but waits for a do-not-evict pod for ever and keeps the budget's
// disruption, so the third is never admitted.
func TestPlanOrdersTheNodesAsTheBudgetsAdmitThem(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	namespace(t, "plan")
	readyNodes(t, "plan", "plan-a", "plan-b", "plan-c")
	budget(t, "plan", 3, "1", nil)
	pod(t, "plan-a", "plan", "web-1", "web", nil, true)
	pod(t, "plan-a", "plan", "web-2", "web", nil, true)
	pdb(t, "plan", "web", 1, 4, 3, 4)
	pod(t, "plan-b", "plan", "precious", "precious", map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}, false)

	out, err := kubectlNodeguard(t, "plan", "-l", "pool=plan", "--pod-cycle=20s", "-o", "json")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	var r plugin.PlanReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("plan -o json is not JSON: %v\n%s", err, out)
	}
	got := map[string]plugin.PlannedNode{}
	for _, n := range r.Nodes {
		got[n.Node] = n
	}
	if a := got["plan-a"]; a.Wave != 1 || a.Estimate != 20*time.Second || a.Blocked != "" {
		t.Errorf("plan-a = wave %d, %s, blocked %q; want wave 1, one 20s cycle (two pods, the PDB allows one)", a.Wave, a.Estimate, a.Blocked)
	}
	if b := got["plan-b"]; b.Wave != 2 || !strings.Contains(b.Blocked, "do-not-evict") || !strings.Contains(b.WaitsFor, "NodeDisruptionBudget plan") ||
		len(b.Lost) != 1 || b.Lost[0] != "plan/precious" {
		t.Errorf("plan-b = %+v; want wave 2 (after plan-a), blocked by its do-not-evict pod, losing plan/precious", b)
	}
	if c := got["plan-c"]; c.Wave != 0 || !strings.Contains(c.WaitsFor, "NodeDisruptionBudget plan") {
		t.Errorf("plan-c = %+v; want never admitted: plan-b keeps the budget's disruption", c)
	}
	if r.Waves != 2 || r.Estimate != 20*time.Second {
		t.Errorf("plan: %d waves, %s; want 2 waves and 20s (plan-b's drain never ends by itself)", r.Waves, r.Estimate)
	}

	// An upgrade surging one node at a time: each wave one node, each
	// replaced, so the budget admits the next. plan-b still never ends.
	out, err = kubectlNodeguard(t, "plan", "plan-a", "plan-c", "--max-surge=1", "--pod-cycle=20s")
	if err != nil {
		t.Fatalf("plan --max-surge: %v\n%s", err, out)
	}
	for _, want := range []string{"1     plan-a  20s", "2     plan-c  0s", "2 node(s) in 2 wave(s), about 20s from the PDB chains"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan --max-surge=1 printed no %q:\n%s", want, out)
		}
	}
}

// TestWhySaysWhatHoldsTheNode asks why a node being deleted is still there:
// its Terminating condition, the budget charged for it, an administrator's
// maintenance Lease, a do-not-evict pod and its events.
func TestWhySaysWhatHoldsTheNode(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	namespace(t, "why")
	readyNodes(t, "why", "why-a", "why-b")
	charged := metav1.NewTime(time.Now().Add(-2 * time.Minute).Truncate(time.Second))
	budget(t, "why", 2, "1", map[string]metav1.Time{"why-a": charged})
	pod(t, "why-a", "why", "precious", "precious", map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}, true)
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "why-a"}}); err != nil {
		t.Fatal(err)
	}
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "why-a"}, &node); err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: ngv1alpha1.TerminatingCondition, Status: corev1.ConditionTrue,
		Reason: "Draining", Message: "waiting for 1 pod (evicting ordinary pods): 1 annotated do-not-evict", LastTransitionTime: metav1.Now()})
	if err := env.Client.Status().Update(ctx, &node); err != nil {
		t.Fatal(err)
	}
	harness.MustCreate(t, env.Client, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "why-a.admitted"}, EventTime: metav1.NowMicro(),
		ReportingController: "nodeguard.io/webhook", ReportingInstance: "nodeguard-0", Action: "Admit", Type: corev1.EventTypeNormal,
		Reason: "NodeDeletionAdmitted", Note: "deletion admitted within NodeDisruptionBudget why",
		Regarding: corev1.ObjectReference{Kind: "Node", Name: "why-a", APIVersion: "v1"},
	})
	harness.MustCreate(t, env.Client, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: "why-b"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kubeadm-upgrade")},
	})

	out, err := kubectlNodeguard(t, "why", "why-a")
	if err != nil {
		t.Fatalf("why why-a: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Deleting:", "nodeguard.io/Terminating  True  Draining", "1 annotated do-not-evict",
		"why  allowed 0, unavailable 1 of max 1  charged for this node 2m ago",
		"pod why/precious annotated nodeguard.io/do-not-evict=true: the drain waits for it",
		"no drain deadline (--drain-timeout 0)",
		"Normal  NodeDeletionAdmitted  deletion admitted within NodeDisruptionBudget why",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("why why-a printed no %q:\n%s", want, out)
		}
	}

	// A node not being deleted: how a delete would be answered now.
	out, err = kubectlNodeguard(t, "why", "why-b", "-o", "json")
	if err != nil {
		t.Fatalf("why why-b: %v\n%s", err, out)
	}
	var r plugin.WhyReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("why -o json is not JSON: %v\n%s", err, out)
	}
	if r.Deleting != nil || !strings.HasPrefix(r.DeleteNow, "denied (429): Lease kube-node-maintenance/why-b held by kubeadm-upgrade until released") {
		t.Errorf("why why-b = deleting %v, a delete now %q; want the administrator's Lease to deny it", r.Deleting, r.DeleteNow)
	}
}

// TestBudgetsSayWhoTheyCountOut lists a budget charged for a node being
// deleted and for someone else's drain, with a NotReady node it counts out
// uncharged.
func TestBudgetsSayWhoTheyCountOut(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	readyNodes(t, "count", "count-a", "count-b", "count-c")
	harness.MustCreate(t, env.Client, builder.Node("count-d", builder.WithLabels("pool", "count"))) // never Ready
	since := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	budget(t, "count", 4, "3", map[string]metav1.Time{"count-a": since, "count-b": since})
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "count-a"}}); err != nil {
		t.Fatal(err)
	}
	var b corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "count-b"}, &b); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(b.DeepCopy())
	b.Annotations = map[string]string{ngv1alpha1.DrainChargedAtAnnotation: since.Format(time.RFC3339), ngv1alpha1.DrainedByAnnotation: "kubectl"}
	if err := env.Client.Patch(ctx, &b, patch); err != nil {
		t.Fatal(err)
	}

	out, err := kubectlNodeguard(t, "budgets")
	if err != nil {
		t.Fatalf("budgets: %v\n%s", err, out)
	}
	// A minute ago, give or take the seconds the test takes up to the read
	// (the stamps are truncated to the second).
	for _, want := range []string{
		`count-a \(charged 6[0-9]s ago for its deletion\)`, `count-b \(charged 6[0-9]s ago for a drain by kubectl\)`, `count-d \(not ready\)`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("budgets printed nothing matching %q:\n%s", want, out)
		}
	}
}

// TestCommandLineFollowsKubectl checks the conventions a kubectl user
// expects: help with examples for each command, -o json|yaml, kubectl's
// error for another format, and a clear error for a plan with no nodes.
func TestCommandLineFollowsKubectl(t *testing.T) {
	root := newRoot(&bytes.Buffer{})
	for _, cmd := range root.Commands() {
		if cmd.Hidden || cmd.Name() == "help" || cmd.Name() == "version" {
			continue
		}
		if cmd.Short == "" || cmd.Example == "" || !strings.HasPrefix(cmd.Example, "  kubectl nodeguard "+cmd.Name()) {
			t.Errorf("%s: want a short description and examples starting %q", cmd.Name(), "  kubectl nodeguard "+cmd.Name())
		}
		if cmd.Flag("output") == nil || cmd.Flag("output").Shorthand != "o" || cmd.Flag("kubeconfig") == nil || cmd.Flag("context") == nil {
			t.Errorf("%s: want -o/--output, --kubeconfig and --context as kubectl has them", cmd.Name())
		}
	}
	if f := root.Commands(); len(f) == 0 {
		t.Fatal("no subcommands")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"budgets", "-o", "wide"}, `unable to match a printer suitable for the output format "wide", allowed formats are: json, yaml`},
		{[]string{"plan"}, "name the nodes or give -l SELECTOR, not both"},
		{[]string{"why"}, "accepts 1 arg(s), received 0"},
	} {
		var out bytes.Buffer
		cmd := newRoot(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kubectl nodeguard %s = %v, want an error %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}
