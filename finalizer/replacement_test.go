package finalizer

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// These tests play the Deployment controller and the disruption controller
// by hand (envtest runs only the API server): they create the ReplicaSets
// and pods a Deployment would have, and write the PDB statuses.

// replaceFixture is a fixture whose reconciler has the replacement options.
func replaceFixture(t *testing.T, ns string, policy drain.BlockedPDBPolicy) *fixture {
	t.Helper()
	f := newFixture(t, ns)
	f.r.Opts.BlockedPDBPolicy = policy
	f.r.Opts.BlockedPDBSettle = DefaultBlockedPDBSettle
	f.r.Opts.ReplacementTimeout = DefaultReplacementTimeout
	return f
}

// restartReconciler replaces the reconciler by a fresh one, as after a
// restart of nodeguard: nothing remembered.
func (f *fixture) restartReconciler() {
	f.r = &Reconciler{Client: f.r.Client, Reader: f.r.Reader, Evictor: f.r.Evictor, Recorder: f.r.Recorder, Clock: f.r.Clock, Opts: f.r.Opts}
}

// workload is a Deployment with the ReplicaSet its controller made.
type workload struct {
	d  *appsv1.Deployment
	rs *appsv1.ReplicaSet
}

// deployment creates a rolled-out Deployment and its ReplicaSet.
func (f *fixture) deployment(t *testing.T, name string, replicas int32, opts ...builder.WorkloadOption) *workload {
	t.Helper()
	ctx := context.Background()
	d := builder.Deployment(f.ns, name, replicas, opts...)
	harness.MustCreate(t, env.Client, d)
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas}
	if err := env.Client.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	return &workload{d: d, rs: f.replicaSet(t, d, name+"-1")}
}

// replicaSet creates a ReplicaSet of the Deployment's current template.
func (f *fixture) replicaSet(t *testing.T, d *appsv1.Deployment, name string) *appsv1.ReplicaSet {
	t.Helper()
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: d.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{Replicas: d.Spec.Replicas, Selector: d.Spec.Selector, Template: d.Spec.Template},
	}
	harness.MustCreate(t, env.Client, rs)
	return rs
}

// podOf creates a pod of the ReplicaSet on the node, Ready unless it is
// unscheduled (node ""), when the scheduler's verdict is given instead.
func (f *fixture) podOf(t *testing.T, rs *appsv1.ReplicaSet, name, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: rs.Spec.Template.Labels, Annotations: rs.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: *rs.Spec.Template.Spec.DeepCopy(),
	}
	p.Spec.NodeName = node
	harness.MustCreate(t, env.Client, p)
	if node == "" {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/3 nodes are available: 3 node(s) were unschedulable."}}
	} else {
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	if err := env.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// readyPod makes a pod Ready.
func readyPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := env.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// pdb creates a PDB over app and writes the status the disruption controller
// would compute.
func (f *fixture) pdb(t *testing.T, app string, spec func(*policyv1.PodDisruptionBudgetSpec), allowed, healthy, desired, expected int32, annotations ...string) {
	t.Helper()
	b := builder.PDB(f.ns, app, spec)
	if len(annotations) == 2 {
		b.Annotations = map[string]string{annotations[0]: annotations[1]}
	}
	harness.MustCreate(t, env.Client, b)
	f.pdbStatus(t, app, allowed, healthy, desired, expected)
}

func (f *fixture) pdbStatus(t *testing.T, app string, allowed, healthy, desired, expected int32) {
	t.Helper()
	var b policyv1.PodDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: app}, &b); err != nil {
		t.Fatal(err)
	}
	b.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: b.Generation, DisruptionsAllowed: allowed,
		CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: expected}
	if err := env.Client.Status().Update(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
}

func getDeployment(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func (f *fixture) evictionRequests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.evictions {
		n += c
	}
	return n
}

// TestReplacementRestartsOnceForTwoDrainingNodes: 3 replicas under
// minAvailable 3 on two nodes deleted together. The PDB is blocked by design;
// after the settle time one drain restarts the Deployment (default maxSurge
// 25%), the other finds the restart and does not restart it again. Neither
// evicts or deletes the old pods, even once the first new pod is Ready and the
// PDB allows a disruption, nor after a restart of nodeguard; the nodes go once
// the Deployment controller removed them.
func TestReplacementRestartsOnceForTwoDrainingNodes(t *testing.T) {
	f := replaceFixture(t, "replace", "")
	ctx := context.Background()
	a, b := f.ns+"-a", f.ns+"-b"
	f.node(t, a, builder.Ready())
	f.node(t, b, builder.Ready())
	web := f.deployment(t, "web", 3)
	old := []*corev1.Pod{f.podOf(t, web.rs, "web-a1", a), f.podOf(t, web.rs, "web-a2", a), f.podOf(t, web.rs, "web-b1", b)}
	f.pdb(t, "web", builder.MinAvailable("3"), 0, 3, 3, 3)
	f.deleteNode(t, a)
	f.deleteNode(t, b)

	f.pass(t, a)
	f.pass(t, b)
	if d := getDeployment(t, f.ns, "web"); d.Generation != 1 {
		t.Fatalf("the Deployment was changed before the settle time: generation %d", d.Generation)
	}
	if c := condition(getNode(t, a), ngv1alpha1.TerminatingCondition); c == nil || !strings.Contains(c.Message, "blocked by design") || !strings.Contains(c.Message, "deciding in") {
		t.Errorf("condition %+v, want one saying the PDB is blocked by design and settling", c)
	}

	f.clock.Step(DefaultBlockedPDBSettle + time.Second)
	f.pass(t, a)
	f.pass(t, b)
	d := getDeployment(t, f.ns, "web")
	if _, ok := d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; !ok || d.Generation != 2 {
		t.Fatalf("the Deployment was not restarted exactly once: generation %d, template annotations %v", d.Generation, d.Spec.Template.Annotations)
	}
	if got := testutil.ToFloat64(replacementRestarts.WithLabelValues(f.ns, restartDone)); got != 1 {
		t.Errorf("nodeguard_replacement_restarts_total{result=restarted} = %v, want 1", got)
	}
	if got := f.events.with(ReasonDrainBlockedByBudget); len(got) != 1 ||
		!containsAll(got[0], "pod "+f.ns+"/web-a1 ", "PDB "+f.ns+"/web", "currentHealthy 3, desiredHealthy 3, expectedPods 3", "restarted Deployment "+f.ns+"/web") {
		t.Errorf("%s events %v, want one, about the pod that started the restart, naming the PDB, its numbers and the restart", ReasonDrainBlockedByBudget, got)
	}
	if got := f.events.with(ReasonWaitingForReplacement); len(got) != 2 || !strings.Contains(got[0], "web-a2") || !strings.Contains(got[1], "web-b1") {
		t.Errorf("%s events %v, want one for each other old pod: web-a2, web-b1", ReasonWaitingForReplacement, got)
	}

	// The first new pod is Ready: the PDB allows a disruption, and nodeguard,
	// even restarted, leaves the old pods to the Deployment controller.
	next := f.replicaSet(t, d, "web-2")
	f.podOf(t, next, "web-new-1", "elsewhere")
	f.pdbStatus(t, "web", 1, 4, 3, 4)
	f.restartReconciler()
	for range 2 {
		f.pass(t, a)
		f.pass(t, b)
	}
	for _, p := range old {
		if got := f.podState(t, p.Name); got != "running" {
			t.Errorf("old pod %s is %s, want running: only its controller may stop it", p.Name, got)
		}
	}
	if c := condition(getNode(t, a), ngv1alpha1.TerminatingCondition); c == nil || !strings.Contains(c.Message, "1 of 3 new pods Ready") {
		t.Errorf("condition %+v, want one saying how the replacement is doing", c)
	}
	if d := getDeployment(t, f.ns, "web"); d.Generation != 2 {
		t.Errorf("the Deployment was restarted again: generation %d", d.Generation)
	}

	// The Deployment controller removes the old pods; both nodes go.
	for _, p := range old {
		f.finish(t, p.Name)
	}
	f.pdbStatus(t, "web", 0, 3, 3, 3)
	for _, n := range []string{a, b} {
		f.pass(t, n)
		if gone, err := harness.NodeGone(ctx, env.Client, n); err != nil || !gone {
			t.Errorf("node %s is not released once its pods are replaced (%v)", n, err)
		}
	}
	if n := f.evictionRequests(); n != 0 {
		t.Errorf("%d eviction requests, want none: %v", n, f.evictions)
	}
}

// TestBlockedByDesignWaitsWhereARestartCannotKeepTheBudget: a StatefulSet, a
// bare pod, a Deployment with maxSurge 0, one whose rollout may take a pod down
// under minAvailable: N, and Deployments opted out on themselves or on their
// PDB: none is restarted, and the event and the node condition say why and
// what to do (the condition for the first five PDBs, counting the sixth).
func TestBlockedByDesignWaitsWhereARestartCannotKeepTheBudget(t *testing.T) {
	f := replaceFixture(t, "waits", "")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	sts := f.pod(t, "sts", node, controlledBy("StatefulSet"))
	bare := f.pod(t, "bare", node)
	for _, p := range []*corev1.Pod{sts, bare} {
		readyPod(t, p)
		f.pdb(t, p.Name, builder.MinAvailable("1"), 0, 1, 1, 1)
	}
	noSurge := f.deployment(t, "nosurge", 1, func(d *appsv1.Deployment) {
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(1))}
	})
	four := f.deployment(t, "four", 4)
	optOut := f.deployment(t, "optout", 1, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "wait"}
	})
	pdbOptOut := f.deployment(t, "pdboptout", 1)
	f.podOf(t, noSurge.rs, "nosurge", node)
	f.podOf(t, four.rs, "four", node)
	f.podOf(t, optOut.rs, "optout", node)
	f.podOf(t, pdbOptOut.rs, "pdboptout", node)
	f.pdb(t, "nosurge", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.pdb(t, "four", builder.MinAvailable("4"), 0, 4, 4, 4)
	f.pdb(t, "optout", builder.MaxUnavailable("0"), 0, 1, 1, 1)
	f.pdb(t, "pdboptout", builder.MinAvailable("1"), 0, 1, 1, 1, ngv1alpha1.BlockedPDBPolicyAnnotation, "wait")
	f.deleteNode(t, node)

	f.pass(t, node)
	f.clock.Step(DefaultBlockedPDBSettle)
	f.pass(t, node)
	f.clock.Step(time.Second)
	f.pass(t, node)
	f.clock.Step(conditionRefresh) // the condition's new detail within the phase
	f.pass(t, node)

	for _, name := range []string{"nosurge", "four", "optout", "pdboptout"} {
		if d := getDeployment(t, f.ns, name); d.Generation != 1 || d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation] != "" {
			t.Errorf("Deployment %s was restarted (generation %d)", name, d.Generation)
		}
	}
	events := f.events.with(ReasonDrainBlockedByBudget)
	c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition)
	for pod, want := range map[string][]string{
		"sts":       {"StatefulSet " + f.ns + "/sts is never restarted", "blocked-pdb-policy wait", "relax the PDB"},
		"bare":      {"has no controller", "blocked-pdb-policy wait"},
		"nosurge":   {"maxSurge 0", "set maxSurge >= 1"},
		"four":      {"may stop 1 pod(s) before their replacements are Ready (maxUnavailable 25% of 4 replicas), which would leave 3 healthy where the PDB requires 4", "set its maxUnavailable to 0"},
		"optout":    {"blocked-pdb-policy wait (annotation on Deployment " + f.ns + "/optout)"},
		"pdboptout": {"blocked-pdb-policy wait (annotation on PDB " + f.ns + "/pdboptout)"},
	} {
		want = append(want, "PDB "+f.ns+"/"+pod)
		if !slices.ContainsFunc(events, func(e string) bool { return containsAll(e, append(want, "pod "+f.ns+"/"+pod+" ")...) }) {
			t.Errorf("no %s event about pod %s says %q: %v", ReasonDrainBlockedByBudget, pod, want, events)
		}
		if pod == "sts" {
			// The sixth PDB in name order: the condition keeps five groups
			// (cluster-api's format) and counts the rest; its event says why.
			want = []string{"\n* 1 Pod with other issues"}
		}
		if c == nil || !containsAll(c.Message, want...) {
			t.Errorf("the node condition does not say %q: %+v", want, c)
		}
	}
	if len(events) != 6 {
		t.Errorf("%d %s events, want one per pod (6): %v", len(events), ReasonDrainBlockedByBudget, events)
	}
	if n := f.evictionRequests(); n != 0 {
		t.Errorf("%d eviction requests under PDBs that allow none, want 0", n)
	}
	if got := testutil.ToFloat64(replacementRestarts.WithLabelValues(f.ns, restartDone)); got != 0 {
		t.Errorf("nodeguard_replacement_restarts_total{result=restarted} = %v, want 0", got)
	}
}

// TestGlobalWaitWithAnOptIn: under --blocked-pdb-policy=wait a Deployment is
// restarted only when its annotation asks for it.
func TestGlobalWaitWithAnOptIn(t *testing.T) {
	f := replaceFixture(t, "optin", drain.BlockedPDBWait)
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	optIn := f.deployment(t, "in", 1, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "replace"}
	})
	plain := f.deployment(t, "plain", 1)
	f.podOf(t, optIn.rs, "in", node)
	f.podOf(t, plain.rs, "plain", node)
	f.pdb(t, "in", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.pdb(t, "plain", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.deleteNode(t, node)
	f.pass(t, node)
	f.clock.Step(DefaultBlockedPDBSettle + time.Second)
	f.pass(t, node)
	if d := getDeployment(t, f.ns, "in"); d.Generation != 2 {
		t.Errorf("the Deployment that opted in was not restarted: generation %d", d.Generation)
	}
	if d := getDeployment(t, f.ns, "plain"); d.Generation != 1 {
		t.Errorf("a Deployment was restarted under --blocked-pdb-policy=wait: generation %d", d.Generation)
	}
	if !slices.ContainsFunc(f.events.with(ReasonDrainBlockedByBudget), func(e string) bool {
		return containsAll(e, "pod "+f.ns+"/plain ", "blocked-pdb-policy wait (--blocked-pdb-policy)")
	}) {
		t.Errorf("no event says why plain waits: %v", f.events.with(ReasonDrainBlockedByBudget))
	}
}

// TestDrainDeadlineLeavesAProgressingReplacementAlone: past the drain
// deadline, a pod that a restart is replacing is not deleted while the
// replacement progresses; once its new pod has not been scheduled for
// --replacement-timeout, the replacement counts as stalled (event, metric,
// condition) and the deadline deletes the pod.
func TestDrainDeadlineLeavesAProgressingReplacementAlone(t *testing.T) {
	f := replaceFixture(t, "stall", "")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready(), func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainTimeoutAnnotation] = "3m" })
	web := f.deployment(t, "web", 1)
	f.podOf(t, web.rs, "web-old", node)
	f.pdb(t, "web", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.deleteNode(t, node)
	f.pass(t, node)
	f.clock.Step(DefaultBlockedPDBSettle + time.Second)
	f.pass(t, node)
	d := getDeployment(t, f.ns, "web")
	if d.Generation != 2 {
		t.Fatalf("not restarted: generation %d", d.Generation)
	}
	f.podOf(t, f.replicaSet(t, d, "web-2"), "web-new", "") // no room: Pending

	f.clock.Step(3 * time.Minute) // past the deadline
	f.pass(t, node)
	if got := f.podState(t, "web-old"); got != "running" {
		t.Fatalf("past the deadline the pod being replaced is %s, want running", got)
	}
	if got := f.events.with(ReasonDrainDeadlineExceeded); len(got) != 1 || !strings.Contains(got[0], "leaving ["+f.ns+"/web-old] to the rollouts replacing them") {
		t.Errorf("%s events %v, want one saying the pod being replaced is left to its rollout", ReasonDrainDeadlineExceeded, got)
	}
	if c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition); c == nil || !strings.Contains(c.Message, "drain deadline passed; waiting for 1 pod that their Deployments' rollouts replace") {
		t.Errorf("condition %+v, want one saying the deadline waits for the replacement", c)
	}

	f.clock.Step(2*time.Minute + 30*time.Second) // the new pod is unscheduled for over 5m
	f.pass(t, node)
	if got := f.podState(t, "web-old"); got == "running" {
		t.Errorf("once the replacement stalled, past the deadline, the pod is %s, want deleted", got)
	}
	if got := f.events.with(ReasonReplacementStalled); len(got) != 1 || !containsAll(got[0], "web-new not scheduled within 5m0s", "0/3 nodes are available", "drain deadline has passed") {
		t.Errorf("%s events %v, want one naming the unscheduled pod and the fallback", ReasonReplacementStalled, got)
	}
	if got := testutil.ToFloat64(replacementRestarts.WithLabelValues(f.ns, restartStalled)); got != 1 {
		t.Errorf("nodeguard_replacement_restarts_total{result=stalled} = %v, want 1", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.evictions[drain.ResultEvicted] != 0 || f.evictions[drain.ResultDeleted] != 1 {
		t.Errorf("eviction results %v, want only the deadline's delete", f.evictions)
	}
}

// TestStalledReplacementFallsBackToWaiting: before any deadline, a stalled
// replacement puts the pod back in its queue, which waits for the PDB.
func TestStalledReplacementFallsBackToWaiting(t *testing.T) {
	f := replaceFixture(t, "fallback", "")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	web := f.deployment(t, "web", 1)
	f.podOf(t, web.rs, "web-old", node)
	f.pdb(t, "web", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.deleteNode(t, node)
	f.pass(t, node)
	f.clock.Step(DefaultBlockedPDBSettle + time.Second)
	f.pass(t, node)
	f.podOf(t, f.replicaSet(t, getDeployment(t, f.ns, "web"), "web-2"), "web-new", "")
	f.clock.Step(DefaultReplacementTimeout + time.Second)
	f.pass(t, node)
	c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition)
	if c == nil || !containsAll(c.Message, "replacement stalled", "web-new not scheduled within 5m0s", "waiting for the PDB to allow a disruption") {
		t.Errorf("condition %+v, want one saying the replacement stalled and the drain waits", c)
	}
	if got := f.events.with(ReasonReplacementStalled); len(got) != 1 || !strings.Contains(got[0], "waiting for PDB "+f.ns+"/web to allow a disruption") {
		t.Errorf("%s events %v, want one saying the drain waits for the PDB", ReasonReplacementStalled, got)
	}
	if d := getDeployment(t, f.ns, "web"); d.Generation != 2 {
		t.Errorf("restarted again after the stall: generation %d", d.Generation)
	}
	// Room appears, the new pod gets Ready: the replacement goes on.
	var pod corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "web-new"}, &pod); err != nil {
		t.Fatal(err)
	}
	readyPod(t, &pod)
	f.pdbStatus(t, "web", 1, 2, 1, 2)
	f.pass(t, node)
	if got := f.podState(t, "web-old"); got != "running" {
		t.Errorf("the old pod is %s once its replacement is Ready, want running (left to its controller)", got)
	}
	if n := f.evictionRequests(); n != 0 {
		t.Errorf("%d eviction requests, want 0", n)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestFirstPassReadsWorkloadsOnlyForADrainBegunElsewhere: the first pass of a
// drain this process began evicts without reading the queues' ReplicaSets and
// Deployments (it made every restart of that drain itself, and the reads held
// its first evictions back); after a restart of nodeguard, the first pass over
// the same drain reads them, for restarts the earlier process made.
func TestFirstPassReadsWorkloadsOnlyForADrainBegunElsewhere(t *testing.T) {
	f := replaceFixture(t, "survey", "")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	web := f.deployment(t, "web", 3)
	f.podOf(t, web.rs, "web-1", node)
	f.podOf(t, web.rs, "web-2", node)
	f.pdb(t, "web", builder.MaxUnavailable("1"), 1, 3, 2, 3)
	reader, reads := workloadReadCounter(t)
	f.r.Reader = reader

	_ = f.r.startLeading(context.Background()) // nodeguard has been leading a while
	f.clock.Step(2 * time.Second)
	f.deleteNode(t, node)
	f.pass(t, node)
	if got := f.podState(t, "web-1"); got == "running" {
		t.Fatal("web-1 is running after the first pass, want evicted")
	}
	if n := reads(); n != 0 {
		t.Errorf("the first pass of a drain begun here read %d ReplicaSets and Deployments, want none", n)
	}

	f.restartReconciler()
	f.r.Reader = reader
	f.clock.Step(time.Second)
	f.pass(t, node)
	if n := reads(); n == 0 {
		t.Error("the first pass after a restart of nodeguard read no ReplicaSet or Deployment: it cannot know the restarts made before it")
	}
}

// workloadReadCounter is a reader of the API server that counts the
// ReplicaSets and Deployments read through it; reads returns the count since
// its last call.
func workloadReadCounter(t *testing.T) (reader client.Reader, reads func() int) {
	t.Helper()
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	reader = interceptor.NewClient(direct, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			switch obj.(type) {
			case *appsv1.ReplicaSet, *appsv1.Deployment:
				mu.Lock()
				n++
				mu.Unlock()
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	return reader, func() int {
		mu.Lock()
		defer mu.Unlock()
		got := n
		n = 0
		return got
	}
}

// TestSettlingQueueReadsNoWorkload: a queue blocked by design says it is
// settling on every pass without reading its ReplicaSet and Deployment (no
// restart can serve it yet); once settled, the pass reads them and restarts
// the Deployment.
func TestSettlingQueueReadsNoWorkload(t *testing.T) {
	f := replaceFixture(t, "settling", "")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	web := f.deployment(t, "web", 2)
	f.podOf(t, web.rs, "web-1", node)
	f.podOf(t, web.rs, "web-2", node)
	f.pdb(t, "web", builder.MinAvailable("2"), 0, 2, 2, 2)
	reader, reads := workloadReadCounter(t)
	f.r.Reader = reader
	_ = f.r.startLeading(context.Background())
	f.clock.Step(2 * time.Second)
	f.deleteNode(t, node)

	for range 3 {
		f.pass(t, node)
		f.clock.Step(2 * time.Second)
	}
	if n := reads(); n != 0 {
		t.Errorf("3 passes over a settling queue read %d ReplicaSets and Deployments, want none", n)
	}
	if c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition); c == nil || !strings.Contains(c.Message, "blocked by design") || !strings.Contains(c.Message, "deciding in") {
		t.Errorf("condition %+v, want one saying the PDB is blocked by design and settling", c)
	}

	f.clock.Step(DefaultBlockedPDBSettle)
	f.pass(t, node)
	if n := reads(); n == 0 {
		t.Error("the pass that decides read no ReplicaSet or Deployment")
	}
	if d := getDeployment(t, f.ns, "web"); d.Generation != 2 {
		t.Errorf("the settled queue's Deployment was not restarted: generation %d", d.Generation)
	}
}

// TestReplaceWithoutThePatchGrantWaits: installed without the Deployment patch
// grant (the default install), a Deployment annotated replace is refused its
// restart by the API server (403): the drain waits as under the policy wait
// and says what to grant, instead of failing every pass.
func TestReplaceWithoutThePatchGrantWaits(t *testing.T) {
	f := replaceFixture(t, "nogrant", drain.BlockedPDBWait)
	ungrantedCfg := rest.CopyConfig(env.Config)
	ungrantedCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:nodeguard-system:without-replace-grant"}
	ungranted, err := client.New(ungrantedCfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Every request as before, but a Deployment's patch as a user with no grant.
	f.r.Client = interceptor.NewClient(direct, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*appsv1.Deployment); ok {
				return ungranted.Patch(ctx, obj, patch, opts...)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	optIn := f.deployment(t, "in", 1, func(d *appsv1.Deployment) {
		d.Annotations = map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "replace"}
	})
	f.podOf(t, optIn.rs, "in", node)
	f.pdb(t, "in", builder.MinAvailable("1"), 0, 1, 1, 1)
	f.deleteNode(t, node)
	f.pass(t, node)
	f.clock.Step(DefaultBlockedPDBSettle + time.Second)
	f.pass(t, node) // fails the test if the 403 fails the pass
	f.pass(t, node)
	if d := getDeployment(t, f.ns, "in"); d.Generation != 1 {
		t.Errorf("the Deployment was restarted without the grant: generation %d", d.Generation)
	}
	waits := slices.DeleteFunc(f.events.with(ReasonDrainBlockedByBudget), func(e string) bool {
		return !containsAll(e, "pod "+f.ns+"/in ", "nodeguard waits", "may not patch Deployment "+f.ns+"/in", "blockedPDBPolicy: replace")
	})
	if len(waits) != 1 {
		t.Errorf("want one event saying the restart needs the grant, got %v", f.events.with(ReasonDrainBlockedByBudget))
	}
}
