package finalizer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// These tests run the termination phases against a real API server (envtest)
// with a fake clock. There is no kubelet: an evicted pod stays Terminating
// until the test deletes it, which is exactly a stuck or unreachable pod.

var env *harness.Env

func TestMain(m *testing.M) {
	harness.Main(m, harness.Options{}, &env)
}

// recorder keeps the events of a test.
type recorder struct {
	mu       sync.Mutex
	events   []string // "Reason note"
	warnings []string // "Reason note" of the Warnings
}

func (r *recorder) Eventf(_ runtime.Object, _ runtime.Object, eventType, reason, _, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := reason + " " + fmt.Sprintf(note, args...)
	r.events = append(r.events, e)
	if eventType == corev1.EventTypeWarning {
		r.warnings = append(r.warnings, e)
	}
}

// warning reports whether the event was recorded as a Warning.
func (r *recorder) warning(event string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.warnings, event)
}

// with returns the events with the reason.
func (r *recorder) with(reason string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if strings.HasPrefix(e, reason+" ") {
			out = append(out, e)
		}
	}
	return out
}

type fixture struct {
	r      *Reconciler
	clock  *clocktesting.FakeClock
	events *recorder
	ns     string
	// evictions counts eviction requests by result.
	mu        sync.Mutex
	evictions map[string]int
}

// runs counts the fixtures made under each name, so that -count=N gets
// fresh names on one API server.
var runs = map[string]int{}

func newFixture(t *testing.T, ns string) *fixture {
	t.Helper()
	harness.SkipWithoutEnv(t, env)
	if runs[ns]++; runs[ns] > 1 {
		ns = fmt.Sprintf("%s%d", ns, runs[ns])
	}
	f := &fixture{clock: clocktesting.NewFakeClock(time.Now()), events: &recorder{}, ns: ns, evictions: map[string]int{}}
	f.r = &Reconciler{
		Client: env.Client, Reader: env.Client,
		Evictor: &drain.Evictor{Client: env.Client, Parallel: 4, Observe: func(result string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.evictions[result]++
		}},
		Recorder: f.events,
		Clock:    f.clock,
		Opts:     Options{Identity: "test", DaemonSets: drain.DaemonSetsLast, StuckPodMargin: DefaultStuckPodMargin},
	}
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	return f
}

// node creates a node carrying the termination finalizer (and any others).
func (f *fixture) node(t *testing.T, name string, opts ...builder.NodeOption) {
	t.Helper()
	opts = append([]builder.NodeOption{builder.WithFinalizers(ngv1alpha1.TerminationFinalizer)}, opts...)
	harness.MustCreate(t, env.Client, builder.Node(name, opts...))
	t.Cleanup(func() {
		// Let go of whatever the test left on the node.
		var n corev1.Node
		if env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n) == nil {
			n.Finalizers = nil
			_ = env.Client.Update(context.Background(), &n)
		}
	})
}

// deleteNode deletes the node in a later second than its pods were created:
// creation and deletion times have whole seconds, and a returning pod created
// in the second of the deletion counts as a replacement.
func (f *fixture) deleteNode(t *testing.T, name string) {
	t.Helper()
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	if err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

type podOption func(*corev1.Pod)

// pod creates a pod bound to the node (no scheduler: nodeName is set).
func (f *fixture) pod(t *testing.T, name, node string, opts ...podOption) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	harness.MustCreate(t, env.Client, p)
	return p
}

// controlledBy makes the pod's controller one of that kind named after the
// pod's name up to its first dash: proxy-2 replaces proxy, as a DaemonSet's
// new pod has the same controller as the old.
func controlledBy(kind string) podOption {
	return func(p *corev1.Pod) {
		owner, _, _ := strings.Cut(p.Name, "-")
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: kind, Name: owner,
			UID: types.UID("uid-" + kind + "-" + owner), Controller: ptr.To(true)}}
	}
}

func priority(class string) podOption {
	return func(p *corev1.Pod) { p.Spec.PriorityClassName = class }
}

func withEmptyDir(p *corev1.Pod) {
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
}

// pass runs one reconcile of the node.
func (f *fixture) pass(t *testing.T, node string) reconcile.Result {
	t.Helper()
	res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: node}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

// podState is "running", "terminating" or "gone".
func (f *fixture) podState(t *testing.T, name string) string {
	t.Helper()
	var p corev1.Pod
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: name}, &p)
	switch {
	case client.IgnoreNotFound(err) != nil:
		t.Fatal(err)
	case err != nil:
		return "gone"
	case p.DeletionTimestamp != nil:
		return "terminating"
	}
	return "running"
}

// finish plays the kubelet confirming a pod's termination.
func (f *fixture) finish(t *testing.T, name string) {
	t.Helper()
	err := env.Client.Delete(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}, client.GracePeriodSeconds(0))
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func condition(n *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestStuckPodNoLongerHoldsTheNode: an evicted pod whose termination nobody
// confirms holds the node for its grace period plus --stuck-pod-margin, and
// not a moment longer. Along the way the node condition says what the drain
// waits for without touching the kubelet's conditions, the bare pod with
// emptyDir data is announced, the maintenance Lease is owned by the node, and
// the condition goes with nodeguard's finalizer while another finalizer keeps
// the node.
func TestStuckPodNoLongerHoldsTheNode(t *testing.T) {
	f := newFixture(t, "stuck")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready(), builder.WithFinalizers("example.com/keep"))
	readyBefore := *condition(getNode(t, node), corev1.NodeReady)
	f.pod(t, "bare", node, withEmptyDir)
	f.deleteNode(t, node)

	f.pass(t, node)
	if got := f.podState(t, "bare"); got != "terminating" {
		t.Fatalf("after the first pass the pod is %s, want terminating (evicted)", got)
	}
	// A drain that ends within 30s would name the pod in NodeReleased.
	if n := len(f.events.with(ReasonEvictingBarePod)) + len(f.events.with(ReasonEvictingLocalData)); n != 0 {
		t.Errorf("%d warnings of the evicted pod at once, want none before the drain lasted %s", n, drainWaitingAfter)
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node}, &lease); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, node)
	if !slices.ContainsFunc(lease.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && o.UID == n.UID }) {
		t.Errorf("maintenance Lease owners %+v, want the node %s", lease.OwnerReferences, n.UID)
	}

	// Within grace (30s) plus margin (1m) the pod holds the node, and the
	// condition says so. (A pass at once sees the pod terminating, as the
	// pod watch's would.)
	f.pass(t, node)
	f.clock.Step(80 * time.Second)
	if res := f.pass(t, node); res.IsZero() {
		t.Fatal("the node was released while its pod was terminating within grace and margin")
	}
	n = getNode(t, node)
	c := condition(n, ngv1alpha1.TerminatingCondition)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != "Draining" || !strings.Contains(c.Message, "Drain not completed yet (started at ") || !strings.Contains(c.Message, "\n* Pod "+f.ns+"/") || !strings.Contains(c.Message, ": deletionTimestamp set, but still not removed from the Node") {
		t.Errorf("condition %+v, want Draining naming the 1 terminating pod", c)
	}
	if got := condition(n, corev1.NodeReady); got == nil || !apiequality.Semantic.DeepEqual(*got, readyBefore) {
		t.Errorf("the kubelet's Ready condition changed: %+v, was %+v", got, readyBefore)
	}
	if len(f.events.with(ReasonPodGivenUp)) != 0 {
		t.Errorf("gave up on a pod within its grace period and margin: %v", f.events.with(ReasonPodGivenUp))
	}
	// The drain has waited on the same pod for 80s: it says so, and says the
	// losses in their own Warnings.
	if got := f.events.with(ReasonDrainWaiting); len(got) != 1 || !strings.Contains(got[0], "waiting for 1 pod") {
		t.Errorf("%s events %q, want one saying what the stalled drain waits for", ReasonDrainWaiting, got)
	}
	bare, local := f.events.with(ReasonEvictingBarePod), f.events.with(ReasonEvictingLocalData)
	if len(bare) != 1 || !strings.Contains(bare[0], "evicted pod "+f.ns+"/bare, which no controller manages: nothing will recreate it") || !f.events.warning(bare[0]) {
		t.Errorf("%s events %q, want one Warning naming the pod", ReasonEvictingBarePod, bare)
	}
	if len(local) != 1 || !strings.Contains(local[0], "evicted pod "+f.ns+"/bare: the data in its emptyDir volumes is lost") || !f.events.warning(local[0]) {
		t.Errorf("%s events %q, want one Warning naming the pod", ReasonEvictingLocalData, local)
	}

	stuckBefore := testutil.ToFloat64(podsGivenUp.WithLabelValues(drain.GiveUpStuck))
	f.clock.Step(15 * time.Second)
	f.pass(t, node)
	if got := testutil.ToFloat64(podsGivenUp.WithLabelValues(drain.GiveUpStuck)) - stuckBefore; got != 1 {
		t.Errorf("nodeguard_drain_pods_given_up_total{cause=stuck} grew by %v, want 1", got)
	}
	if got := f.events.with(ReasonPodGivenUp); len(got) != 1 || !strings.Contains(got[0], f.ns+"/bare") || !strings.Contains(got[0], "past its grace period") {
		t.Errorf("%s events %v, want one naming stuck/bare and why", ReasonPodGivenUp, got)
	}
	n = getNode(t, node)
	if slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatal("the node is not released past grace and margin")
	}
	if c := condition(n, ngv1alpha1.TerminatingCondition); c != nil {
		t.Errorf("the %s condition stayed after release: %+v", ngv1alpha1.TerminatingCondition, c)
	}
	if got := condition(n, corev1.NodeReady); got == nil || !apiequality.Semantic.DeepEqual(*got, readyBefore) {
		t.Errorf("the kubelet's Ready condition changed: %+v, was %+v", got, readyBefore)
	}
	if got := f.podState(t, "bare"); got != "terminating" {
		t.Errorf("the stuck pod is %s; nodeguard should leave it to the pod garbage collector", got)
	}
	if rel := f.events.with(ReasonReleased); len(rel) != 1 || strings.Contains(rel[0], "/bare") || f.events.warning(rel[0]) {
		t.Errorf("%s events %q, want one Normal event that does not name the pod again", ReasonReleased, rel)
	}
}

// TestBarePodsAreAnnouncedInTheRelease: a node of twelve pods no controller
// manages, two of them with emptyDir data, drained within 30s, names them in
// its NodeReleased event, then a Warning (ten by name, then how many more),
// not in events of their own: a fleet of such nodes pays no event more each.
func TestBarePodsAreAnnouncedInTheRelease(t *testing.T) {
	f := newFixture(t, "bare")
	node := f.ns + "-node"
	f.node(t, node)
	for i := range 12 {
		if i < 2 {
			f.pod(t, fmt.Sprintf("bare-%02d", i), node, withEmptyDir)
		} else {
			f.pod(t, fmt.Sprintf("bare-%02d", i), node)
		}
	}
	f.deleteNode(t, node)

	f.pass(t, node)
	for i := range 12 {
		f.finish(t, fmt.Sprintf("bare-%02d", i))
	}
	f.clock.Step(drainWaitingAfter - time.Second)
	f.passUntil(t, node, func() bool { return len(f.events.with(ReasonReleased)) > 0 }, "the node is released")
	if n := len(f.events.with(ReasonEvictingBarePod)) + len(f.events.with(ReasonEvictingLocalData)); n != 0 {
		t.Errorf("%d events of their own for the evicted pods, want them in %s", n, ReasonReleased)
	}
	rel := f.events.with(ReasonReleased)
	for _, want := range []string{
		"evicted 12 pods " + f.ns + "/bare-00, " + f.ns + "/bare-01, ",
		", ... (2 more), which no controller manages (nothing will recreate them)",
		"; evicted 2 pods " + f.ns + "/bare-00, " + f.ns + "/bare-01 with emptyDir data, which is lost",
	} {
		if !strings.Contains(rel[0], want) {
			t.Errorf("%s event %q does not say %q", ReasonReleased, rel[0], want)
		}
	}
	if !f.events.warning(rel[0]) {
		t.Errorf("%s event %q is not a Warning, though it names lost pods", ReasonReleased, rel[0])
	}
}

// TestDrainThatKeepsGoingHoldsItsEventsForTheRelease: a drain that lasts
// past drainWaitingAfter but never waits on the same thing that long (a
// fleet's node, its pods going one at a time) writes no DrainWaiting event
// and no Warning of its own for its bare pod: its NodeReleased, a Warning,
// names the pod.
func TestDrainThatKeepsGoingHoldsItsEventsForTheRelease(t *testing.T) {
	f := newFixture(t, "going")
	node := f.ns + "-node"
	f.node(t, node)
	f.pod(t, "bare", node)
	for i := range 3 {
		f.pod(t, fmt.Sprintf("web-%d", i), node, controlledBy("ReplicaSet"))
	}
	f.deleteNode(t, node)

	f.pass(t, node)
	for i := range 3 { // a pod goes every 20 s: 60 s of drain in all
		f.clock.Step(20 * time.Second)
		f.finish(t, fmt.Sprintf("web-%d", i))
		if res := f.pass(t, node); res.IsZero() {
			t.Fatalf("released with the bare pod still terminating")
		}
	}
	if got := f.events.with(ReasonDrainWaiting); len(got) != 0 {
		t.Errorf("%s events %q from a drain whose pods kept going", ReasonDrainWaiting, got)
	}
	if got := f.events.with(ReasonEvictingBarePod); len(got) != 0 {
		t.Errorf("%s events %q before the release of a drain that kept going", ReasonEvictingBarePod, got)
	}
	f.finish(t, "bare")
	f.passUntil(t, node, func() bool { return len(f.events.with(ReasonReleased)) > 0 }, "the node is released")
	if rel := f.events.with(ReasonReleased)[0]; !strings.Contains(rel, "evicted pod "+f.ns+"/bare, which no controller manages") || !f.events.warning(rel) {
		t.Errorf("%s event %q, want a Warning naming the bare pod", ReasonReleased, rel)
	}
}

// TestUnreachableNodeWaitsOnlyAShortMargin: on a node whose Ready condition is
// Unknown, evicted pods are waited for UnreachableMargin, not their grace
// period; an event names each pod given up on. A Lease left from an earlier
// holder gets the node as owner when nodeguard takes it.
func TestUnreachableNodeWaitsOnlyAShortMargin(t *testing.T) {
	f := newFixture(t, "unreachable")
	node := f.ns + "-node"
	old := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone"), LeaseDurationSeconds: ptr.To[int32](1),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Now().Add(-time.Hour)))},
	}
	_ = env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ngv1alpha1.MaintenanceLeaseNamespace}})
	harness.MustCreate(t, env.Client, old)
	f.node(t, node, builder.Unreachable())
	for i := range 3 {
		f.pod(t, fmt.Sprintf("web-%d", i), node, controlledBy("ReplicaSet"))
	}
	f.deleteNode(t, node)

	f.pass(t, node)
	for i := range 3 {
		if got := f.podState(t, fmt.Sprintf("web-%d", i)); got != "terminating" {
			t.Fatalf("web-%d is %s after the first pass, want terminating", i, got)
		}
	}
	if res := f.pass(t, node); res.IsZero() {
		t.Fatal("released before the unreachable margin")
	}
	if len(f.events.with(ReasonEvictingBarePod)) != 0 {
		t.Errorf("pods with a controller announced as bare: %v", f.events.with(ReasonEvictingBarePod))
	}

	f.clock.Step(drain.UnreachableMargin + time.Second)
	f.pass(t, node)
	if gone, err := harness.NodeGone(context.Background(), env.Client, node); err != nil || !gone {
		t.Fatalf("the unreachable node is not released %s after its pods' eviction (%v)", drain.UnreachableMargin, err)
	}
	given := f.events.with(ReasonPodGivenUp)
	for i := range 3 {
		name := fmt.Sprintf("%s/web-%d", f.ns, i)
		if !slices.ContainsFunc(given, func(e string) bool { return strings.Contains(e, name) && strings.Contains(e, "unreachable") }) {
			t.Errorf("no %s event names %s and why: %v", ReasonPodGivenUp, name, given)
		}
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(old), &lease); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(lease.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && o.Name == node }) {
		t.Errorf("the taken-over Lease is not owned by its node: %+v", lease.OwnerReferences)
	}
}

// TestTiersAndReturningPods: ordinary pods go first, system-critical pods
// only once no ordinary pod is left (terminating ones included), DaemonSet
// pods last; the DaemonSet pod is evicted once and the replacement its
// controller puts back is ignored.
func TestTiersAndReturningPods(t *testing.T) {
	f := newFixture(t, "tiers")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready())
	f.pod(t, "app", node, controlledBy("ReplicaSet"))
	f.pod(t, "dns", node, controlledBy("ReplicaSet"), priority("system-cluster-critical"))
	f.pod(t, "proxy", node, controlledBy("DaemonSet"), priority("system-node-critical"))
	f.pod(t, "agent", node, controlledBy("ReplicaSet"), func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	})
	f.deleteNode(t, node)
	states := func() string {
		return strings.Join([]string{f.podState(t, "app"), f.podState(t, "dns"), f.podState(t, "proxy"), f.podState(t, "agent")}, ",")
	}
	steps := []struct {
		finish string // the pod whose termination the kubelet confirms before the pass
		want   string // app, dns, proxy, agent after the pass
	}{
		{"", "terminating,running,running,running"},
		{"", "terminating,running,running,running"}, // an ordinary pod still terminates
		{"app", "gone,terminating,running,running"},
		{"", "gone,terminating,running,running"},
		{"dns", "gone,gone,terminating,terminating"},
	}
	for i, s := range steps {
		if s.finish != "" {
			f.finish(t, s.finish)
		}
		f.pass(t, node)
		if got := states(); got != s.want {
			t.Fatalf("pass %d: app,dns,proxy,agent are %s, want %s", i+1, got, s.want)
		}
	}
	if c := condition(getNode(t, node), ngv1alpha1.TerminatingCondition); c == nil || !strings.Contains(c.Message, "Drain not completed yet") {
		t.Errorf("condition %+v, want one saying what the drain waits for", c)
	}
	// Their controllers put them back; the old ones finish.
	f.finish(t, "proxy")
	f.finish(t, "agent")
	f.pod(t, "proxy-2", node, controlledBy("DaemonSet"), priority("system-node-critical"))
	f.pod(t, "agent-2", node, controlledBy("ReplicaSet"), func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	})
	f.clock.Step(time.Second)
	f.pass(t, node)
	if gone, err := harness.NodeGone(context.Background(), env.Client, node); err != nil || !gone {
		t.Fatalf("the node is not released once only replacements of returning pods are left (%v)", err)
	}
	if f.podState(t, "proxy-2") != "running" || f.podState(t, "agent-2") != "running" {
		t.Error("a replacement of a returning pod was evicted")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.evictions[drain.ResultEvicted]; got != 4 {
		t.Errorf("%d evictions, want 4 (one per original pod): %v", got, f.evictions)
	}
}

// TestDaemonSetPodOfTheDeletionsSecondIsEvictedOnce: a node deleted in the
// second its DaemonSet pod was created (creation and deletion times have
// whole seconds, so they are equal). The pod is the original and is evicted;
// the DaemonSet's new pod, whatever its second, is its replacement and is
// not, and the node is released.
func TestDaemonSetPodOfTheDeletionsSecondIsEvictedOnce(t *testing.T) {
	f := newFixture(t, "samesecond")
	proxy := []podOption{controlledBy("DaemonSet"), priority("system-node-critical")}
	node := f.nodeDeletedInTheSecondOf(t, "proxy", proxy...)
	f.pass(t, node)
	if got := f.podState(t, "proxy"); got != "terminating" {
		t.Fatalf("the DaemonSet pod created in the second of the node's deletion is %s, want terminating (evicted)", got)
	}
	f.finish(t, "proxy")
	f.pod(t, "proxy-2", node, proxy...)
	f.clock.Step(time.Second)
	f.pass(t, node)
	if gone, err := harness.NodeGone(context.Background(), env.Client, node); err != nil || !gone {
		t.Fatalf("the node is not released once only the DaemonSet's replacement is left (%v)", err)
	}
	if got := f.podState(t, "proxy-2"); got != "running" {
		t.Errorf("the DaemonSet's replacement is %s, want running", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.evictions[drain.ResultEvicted]; got != 1 {
		t.Errorf("%d evictions, want 1: %v", got, f.evictions)
	}
}

// nodeDeletedInTheSecondOf creates a node and a pod on it, then deletes the
// node in the second the pod was created, and returns the node's name. When
// the second ran out in between, it tries again on a new node.
func (f *fixture) nodeDeletedInTheSecondOf(t *testing.T, pod string, opts ...podOption) string {
	t.Helper()
	for attempt := 1; attempt <= 3; attempt++ {
		node := fmt.Sprintf("%s-node-%d", f.ns, attempt)
		f.node(t, node, builder.Ready())
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
		created := f.pod(t, pod, node, opts...)
		if err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(created), created); err != nil {
			t.Fatal(err)
		}
		if deleted := getNode(t, node).DeletionTimestamp; deleted != nil && deleted.Equal(&created.CreationTimestamp) {
			return node
		}
		f.finish(t, pod)
		harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) { return f.podState(t, pod) == "gone", nil }, "pod %s is gone", pod)
	}
	t.Fatal("three times the second ran out between creating the pod and deleting its node")
	return ""
}

func TestUnreachable(t *testing.T) {
	ready := func(s corev1.ConditionStatus) builder.NodeOption {
		return func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}
		}
	}
	taint := func(key string) builder.NodeOption {
		return builder.WithTaints(corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
	}
	tests := []struct {
		name string
		opts []builder.NodeOption
		want bool
	}{
		{"ready", []builder.NodeOption{ready(corev1.ConditionTrue)}, false},
		{"kubelet silent (Unknown)", []builder.NodeOption{ready(corev1.ConditionUnknown)}, true},
		{"not ready, kubelet alive", []builder.NodeOption{ready(corev1.ConditionFalse)}, false},
		{"not ready, VM shut down", []builder.NodeOption{ready(corev1.ConditionFalse), taint(ngv1alpha1.CloudShutdownTaintKey)}, true},
		{"ready, shutdown taint not yet gone", []builder.NodeOption{ready(corev1.ConditionTrue), taint(ngv1alpha1.CloudShutdownTaintKey)}, false},
		{"out of service", []builder.NodeOption{ready(corev1.ConditionFalse), taint(ngv1alpha1.OutOfServiceTaintKey)}, true},
		{"no Ready condition", nil, false},
	}
	for _, tt := range tests {
		if got := unreachable(builder.Node("n", tt.opts...)); got != tt.want {
			t.Errorf("%s: unreachable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDrainDeadlineCoversTerminatingPods: past the drain deadline the pods
// left are deleted, do-not-evict notwithstanding, and terminating pods no
// longer hold the node, however long their grace period.
func TestDrainDeadlineCoversTerminatingPods(t *testing.T) {
	f := newFixture(t, "deadline")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready(), func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainTimeoutAnnotation] = "1m" })
	long := func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3600) }
	f.pod(t, "slow", node, controlledBy("ReplicaSet"), long)
	f.pod(t, "pinned", node, controlledBy("ReplicaSet"), long, func(p *corev1.Pod) {
		p.Annotations = map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}
	})
	f.deleteNode(t, node)

	f.pass(t, node)
	if got := f.podState(t, "slow") + "," + f.podState(t, "pinned"); got != "terminating,running" {
		t.Fatalf("before the deadline slow,pinned are %s, want terminating,running", got)
	}
	f.clock.Step(30 * time.Second)
	if res := f.pass(t, node); res.IsZero() {
		t.Fatal("released before the deadline")
	}

	f.clock.Step(35 * time.Second) // past deletion + 1m
	for range 3 {                  // delete what is left, then give up on it
		f.pass(t, node)
	}
	if gone, err := harness.NodeGone(context.Background(), env.Client, node); err != nil || !gone {
		t.Fatalf("the node is not released past its drain deadline (%v); events %v", err, f.events.events)
	}
	if len(f.events.with(ReasonDrainDeadlineExceeded)) != 1 {
		t.Errorf("%s events %v, want 1", ReasonDrainDeadlineExceeded, f.events.with(ReasonDrainDeadlineExceeded))
	}
	given := f.events.with(ReasonPodGivenUp)
	for _, name := range []string{"slow", "pinned"} {
		if !slices.ContainsFunc(given, func(e string) bool { return strings.Contains(e, f.ns+"/"+name) && strings.Contains(e, "deadline") }) {
			t.Errorf("no %s event names %s and the deadline: %v", ReasonPodGivenUp, name, given)
		}
	}
}

// TestDrainLooksAgainAtItsDeadline: a drain waiting on a pod it may not evict
// looks again when its deadline passes, not a backstop later, so the pods
// left are deleted on time.
func TestDrainLooksAgainAtItsDeadline(t *testing.T) {
	f := newFixture(t, "deadlinewake")
	node := f.ns + "-node"
	f.node(t, node, builder.Ready(), func(n *corev1.Node) { n.Annotations[ngv1alpha1.DrainTimeoutAnnotation] = "1m" })
	f.pod(t, "pinned", node, controlledBy("ReplicaSet"), func(p *corev1.Pod) {
		p.Annotations = map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}
	})
	f.deleteNode(t, node)
	deadline := getNode(t, node).DeletionTimestamp.Add(time.Minute)

	for _, left := range []time.Duration{30 * time.Second, 2 * time.Second, 300 * time.Millisecond} {
		f.clock.SetTime(deadline.Add(-left))
		res := f.pass(t, node)
		if res.RequeueAfter <= 0 || res.RequeueAfter > left+time.Millisecond {
			t.Errorf("with %v to the drain deadline the drain looks again in %v, want by the deadline", left, res.RequeueAfter)
		}
	}
	f.clock.SetTime(deadline)
	f.pass(t, node)
	if got := f.podState(t, "pinned"); got != "terminating" {
		t.Errorf("the do-not-evict pod is %s at the drain deadline, want deleted", got)
	}
}

// TestNodeWrittenDuringThePassIsNotAFailure: other writers change a node
// while a pass writes it. The taint watcher's and the kubelet's writes land
// as its deletion does: the cordon and the release test only the field they
// replace, so such a write never makes them fail, and is kept. A writer that
// changes that very field (a taint added, a finalizer before nodeguard's
// removed, which moves it) makes the API server refuse the patch; the pass is no failure (no
// reconcile error, whose log carries a stack trace): the cordon reads the
// node again and cordons in the same pass (the other writer's taint kept),
// and the release looks again at once.
func TestNodeWrittenDuringThePassIsNotAFailure(t *testing.T) {
	for _, tt := range []struct {
		name string
		// cordon and release are the other writers' changes that race them.
		cordon, release func(*corev1.Node)
		// releaseRefused: the release's patch is refused and the next pass
		// releases.
		releaseRefused bool
	}{
		{name: "annotations", cordon: annotate("example.com/other-writer"), release: annotate("example.com/at-release")},
		{name: "the same fields", cordon: addTaint("example.com/other-writer"), releaseRefused: true,
			// Its finalizer, before nodeguard's, is removed: nodeguard's moves.
			release: func(n *corev1.Node) {
				n.Finalizers = slices.DeleteFunc(n.Finalizers, func(f string) bool { return f == "example.com/other-writer" })
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "conflict")
			node := f.ns + "-node"
			f.node(t, node, builder.Ready())
			if tt.releaseRefused {
				patchNode(t, node, func(n *corev1.Node) { n.Finalizers = append([]string{"example.com/other-writer"}, n.Finalizers...) })
			}
			f.pod(t, "web", node, controlledBy("ReplicaSet")) // evicted, it stays terminating: the node stays
			f.deleteNode(t, node)
			direct := f.r.Client
			raceNextNodePatch := func(write func(*corev1.Node)) func() bool {
				var raced func() bool
				f.r.Client, raced = harness.NodePatchRacedOnce(t, env, write)
				return raced
			}

			// kept: the other writer's change is on the node.
			kept := func(n *corev1.Node) bool {
				return n.Annotations["example.com/other-writer"] == "x" ||
					slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "example.com/other-writer" })
			}
			raced := raceNextNodePatch(tt.cordon)
			if _, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: node}}); err != nil {
				t.Fatalf("a cordon raced by another writer failed the pass: %v", err)
			}
			if !raced() {
				t.Fatal("the pass wrote no node: the race was not played")
			}
			n := getNode(t, node)
			if !n.Spec.Unschedulable || drainingTaint(n) == nil || !kept(n) {
				t.Errorf("after the raced pass: unschedulable %v, taints %v, annotations %v; want cordoned, tainted and the other write kept in the same pass",
					n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
			}

			f.r.Client = direct
			harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
				return f.podState(t, "web") == "terminating", nil
			}, "the pod is evicted")
			f.finish(t, "web")
			raced = raceNextNodePatch(tt.release)
			res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: node}})
			if err != nil {
				t.Fatalf("a release raced by another writer failed the pass: %v", err)
			}
			if !raced() {
				t.Fatal("the release pass wrote no node: the race was not played")
			}
			if !tt.releaseRefused {
				if gone, err := harness.NodeGone(context.Background(), env.Client, node); !gone || err != nil {
					t.Fatalf("the node is still there (%v) after a release raced by an annotation, want released in the same pass", err)
				}
				wantOneRelease(t, f)
				return
			}
			if res.RequeueAfter <= 0 || res.RequeueAfter > time.Second {
				t.Errorf("after the release was refused the pass asks to run again after %v, want at once", res.RequeueAfter)
			}
			if !slices.Contains(getNode(t, node).Finalizers, ngv1alpha1.TerminationFinalizer) {
				t.Fatal("the finalizer is gone although its index changed before the release: the test did not race it")
			}
			f.pass(t, node)
			harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
				return harness.NodeGone(ctx, env.Client, node)
			}, "the next pass releases the node")
			wantOneRelease(t, f)
		})
	}
}

// wantOneRelease checks that the node was released once, and its cordon
// counted once, however many tries either took.
func wantOneRelease(t *testing.T, f *fixture) {
	t.Helper()
	got := f.events.with(ReasonReleased)
	if len(got) != 1 || strings.Count(got[0], "cordoned and tainted") != 1 {
		t.Errorf("%s events %q, want one, naming the cordon once", ReasonReleased, got)
	}
}

// addTaint is another writer adding a taint to a node.
func addTaint(key string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectPreferNoSchedule})
	}
}

// annotate is another writer setting an annotation on a node.
func annotate(key string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = "x"
	}
}
