package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Replacement first: a workload whose PDB allows no disruption while healthy
// (one replica under minAvailable: 1) leaves its node only when nodeguard has
// its Deployment start the replacement elsewhere first. Every node here
// carries what an AKS node carries besides the workload: a DaemonSet that
// tolerates every taint and a system-critical Deployment.

// replaceCluster is a pool of target nodes carrying the workloads under test
// and the production extras, spare nodes for the replacements, and nodeguard
// running through a recording API proxy.
type replaceCluster struct {
	ns      string
	targets []string
	proxy   *harness.APIProxy
	passes  *passCounter
}

// newReplaceCluster creates the target nodes, then calls place (which creates
// the workloads, pinned to the pool, and waits for them to run on the
// targets), then the spare nodes, an ARM emulator holding every node, and
// nodeguard with extra flags.
func newReplaceCluster(t *testing.T, name string, targets int, place func(ns string), extra ...string) *replaceCluster {
	t.Helper()
	c := &replaceCluster{ns: freshName(name)}
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})
	pool := &azurePool{pool: c.ns}
	node := func(nodeName string, i int) *corev1.Node {
		return pool.node(nodeName, 60+i, fmt.Sprintf("10.70.%d.%d", len(c.ns), i+4))
	}
	for i := range targets {
		c.targets = append(c.targets, fmt.Sprintf("%s-target-%d", c.ns, i))
		harness.MustCreate(t, env.Client, node(c.targets[i], i))
	}
	// Ready and untainted first, so that the scheduler spreads over all of them.
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		for _, name := range c.targets {
			var n corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil || len(n.Spec.Taints) > 0 || !nodeReady(&n) {
				return false, err
			}
		}
		return true, nil
	}, "the target nodes are Ready and untainted")
	harness.MustCreate(t, env.Client, allTolerating(c.ns, "proxy", c.ns))
	harness.MustCreate(t, env.Client, builder.Deployment(c.ns, "coredns", 1, builder.OnNodes("pool", c.ns), systemCritical))
	place(c.ns)
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := c.podsOnTargets(ctx)
		ready := map[string]int{}
		for i := range pods {
			if harness.PodReady(&pods[i]) {
				ready[pods[i].Labels["app"]]++
			}
		}
		return ready["proxy"] == targets && ready["coredns"] == 1, err
	}, "the tolerate-all DaemonSet and the system-critical pod run on the targets")
	for i := range 2 {
		harness.MustCreate(t, env.Client, node(fmt.Sprintf("%s-spare-%d", c.ns, i), targets+i))
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, pool.vms, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	c.proxy = startAPIProxy(t)
	// Replacement first, unless the test's flags say otherwise (the last wins).
	extra = append([]string{"--blocked-pdb-policy=replace"}, extra...)
	_, c.passes = startNodeguardCountingPasses(t, c.proxy.Kubeconfig, emu, extra...)
	for _, n := range c.targets {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	return c
}

func (c *replaceCluster) podsOnTargets(ctx context.Context) ([]corev1.Pod, error) {
	var out []corev1.Pod
	for _, n := range c.targets {
		pods, err := evictablePodsOn(ctx, c.ns, n)
		if err != nil {
			return nil, err
		}
		out = append(out, pods...)
	}
	return out, nil
}

// readyPods returns the Ready pods of an app on the targets, by name.
func (c *replaceCluster) readyPods(ctx context.Context, app string) ([]string, error) {
	pods, err := c.podsOnTargets(ctx)
	var names []string
	for i := range pods {
		if pods[i].Labels["app"] == app && pods[i].DeletionTimestamp == nil && harness.PodReady(&pods[i]) {
			names = append(names, pods[i].Name)
		}
	}
	slices.Sort(names)
	return names, err
}

// deleteTargets deletes every target with one kubectl delete node.
func (c *replaceCluster) deleteTargets(t *testing.T) {
	t.Helper()
	harness.MustKubectl(t, env.Kubeconfig, "", append(append([]string{"delete", "node"}, c.targets...), "--wait=false")...)
}

func (c *replaceCluster) waitReleased(t *testing.T, within time.Duration) {
	t.Helper()
	for _, n := range c.targets {
		harness.Eventually(t, within, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "node %s is released", n)
	}
}

// requireUntouched fails the test if nodeguard sent any write for the pods
// (an eviction or a delete).
func (c *replaceCluster) requireUntouched(t *testing.T, pods []string) {
	t.Helper()
	for _, p := range pods {
		path := "/api/v1/namespaces/" + c.ns + "/pods/" + p
		for _, w := range c.proxy.Writes("", path) {
			if w.Path == path || strings.HasPrefix(w.Path, path+"/") {
				t.Errorf("nodeguard sent %s %s (answer %d): only the Deployment controller may stop pod %s", w.Method, w.Path, w.Status, p)
			}
		}
	}
}

// deploymentWrites are nodeguard's write requests for a Deployment.
func (c *replaceCluster) deploymentWrites(name string) []harness.Write {
	return c.proxy.Writes("", "/apis/apps/v1/namespaces/"+c.ns+"/deployments/"+name)
}

// readyLog watches an app's pods and records the fewest Ready ones (not
// deleting) it ever had at once, from when it is armed.
type readyLog struct {
	app    string
	mu     sync.Mutex
	ready  map[string]bool
	armed  bool
	fewest int
	at     string // the pods' states at the fewest
}

func watchReady(t *testing.T, ns, app string) *readyLog {
	t.Helper()
	l := &readyLog{app: app, ready: map[string]bool{}, fewest: -1}
	startWatch(t, &corev1.PodList{}, []client.ListOption{client.InNamespace(ns), client.MatchingLabels{"app": app}},
		func(typ watch.EventType, obj client.Object) {
			pod := obj.(*corev1.Pod)
			l.mu.Lock()
			defer l.mu.Unlock()
			if typ == watch.Deleted {
				delete(l.ready, pod.Name)
			} else {
				l.ready[pod.Name] = pod.DeletionTimestamp == nil && harness.PodReady(pod)
			}
			if l.armed {
				l.observe()
			}
		}, nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = true
	l.observe()
	return l
}

func (l *readyLog) observe() {
	n := 0
	for _, ok := range l.ready {
		if ok {
			n++
		}
	}
	if l.fewest < 0 || n < l.fewest {
		l.fewest, l.at = n, fmt.Sprint(l.ready)
	}
}

// require fails the test if the app ever had fewer than want Ready pods.
func (l *readyLog) require(t *testing.T, want int) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fewest < want {
		t.Errorf("%s had %d Ready pods at one moment (%s), want at least %d at every moment", l.app, l.fewest, l.at, want)
	}
	return l.fewest
}

// waitForEventNote waits for an event about the object whose note has every part.
func waitForEventNote(t *testing.T, regarding, reason string, parts ...string) {
	t.Helper()
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		notes, err := harness.EventNotes(ctx, env.Client, regarding, reason)
		return slices.ContainsFunc(notes, func(n string) bool { return containsAll(n, parts...) }), err
	}, "an event %s about %s says %q", reason, regarding, parts)
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func deploymentOf(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

// waitReadyOnTargets waits until want pods of the app are Ready on the targets
// and returns their names.
func (c *replaceCluster) waitReadyOnTargets(t *testing.T, app string, want int) []string {
	t.Helper()
	var names []string
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		names, err = c.readyPods(ctx, app)
		return len(names) == want, err
	}, "%d pods of %s are Ready on the targets", want, app)
	return names
}

// TestReplacementFirstReleasesASingleReplicaNode: the only replica of a
// Deployment under minAvailable: 1 (default maxSurge 25%) on a node deleted
// with kubectl delete node. nodeguard names the blocked-by-design PDB in an
// event and the node condition, restarts the Deployment once, and the node is
// released once the replacement is Ready elsewhere; a watch on the pods sees
// at least 1 Ready at every moment, and nodeguard sent no eviction or delete
// for the old pod. The DaemonSet and system-critical pods are drained as
// usual, after it.
func TestReplacementFirstReleasesASingleReplicaNode(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	c := newReplaceCluster(t, "single", 1, func(ns string) {
		harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 1, builder.OnNodes("pool", ns)))
		harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MinAvailable("1")))
	})
	target := c.targets[0]
	old := c.waitReadyOnTargets(t, "web", 1)
	generation := deploymentOf(t, c.ns, "web").Generation
	ready := watchReady(t, c.ns, "web")
	conditions := watchCondition(t, target)

	c.deleteTargets(t)
	c.waitReleased(t, 2*time.Minute)

	fewest := ready.require(t, 1)
	c.requireUntouched(t, old)
	d := deploymentOf(t, c.ns, "web")
	if _, ok := d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; !ok || d.Generation != generation+1 {
		t.Errorf("the Deployment was not restarted exactly once: generation %d (was %d), template annotations %v", d.Generation, generation, d.Spec.Template.Annotations)
	}
	if w := c.deploymentWrites("web"); len(w) != 1 || w[0].Method != "PATCH" {
		t.Errorf("nodeguard's writes to the Deployment %+v, want one PATCH", w)
	}
	waitForEventNote(t, target, "DrainBlockedByBudget", "pod "+c.ns+"/"+old[0], "PDB "+c.ns+"/web",
		"currentHealthy 1, desiredHealthy 1, expectedPods 1", "restarted Deployment "+c.ns+"/web")
	waitForEventNote(t, "web", "RestartedForDrain", target)
	conditions.requireWaiting(t, "Draining", "under PDB "+c.ns+"/web", "blocked by design")
	evicted := map[string]bool{}
	for _, e := range c.proxy.Evictions(c.ns) {
		evicted[strings.SplitN(e.Pod, "-", 2)[0]] = e.Status == 201
	}
	if !evicted["coredns"] || !evicted["proxy"] {
		t.Errorf("the system-critical and DaemonSet pods were not evicted: %+v", c.proxy.Evictions(c.ns))
	}
	t.Logf("released; fewest Ready web pods at any moment: %d", fewest)
}

// TestReplacementFirstOneRestartForTwoNodes: 3 replicas under minAvailable: 3
// spread over 2 nodes deleted with one kubectl delete node: one restart in
// total, never fewer than 3 Ready, no eviction or delete of the old pods.
func TestReplacementFirstOneRestartForTwoNodes(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	c := newReplaceCluster(t, "pair", 2, func(ns string) {
		harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 3, builder.OnNodes("pool", ns), spreadOverNodes))
		harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MinAvailable("3")))
	})
	old := c.waitReadyOnTargets(t, "web", 3)
	for _, n := range c.targets {
		pods, err := evictablePodsOn(context.Background(), c.ns, n)
		if err != nil || !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Labels["app"] == "web" }) {
			t.Fatalf("no web pod on %s (%v): the test needs them spread over both nodes", n, err)
		}
	}
	generation := deploymentOf(t, c.ns, "web").Generation
	ready := watchReady(t, c.ns, "web")

	c.deleteTargets(t)
	c.waitReleased(t, 3*time.Minute)

	ready.require(t, 3)
	c.requireUntouched(t, old)
	if d := deploymentOf(t, c.ns, "web"); d.Generation != generation+1 {
		t.Errorf("Deployment generation %d (was %d): want exactly one restart for both nodes", d.Generation, generation)
	}
	// Both drains may decide at once: the restart carries an optimistic lock,
	// so one PATCH succeeds and the other gets 409 and finds the restart.
	writes := c.deploymentWrites("web")
	if ok := slices.DeleteFunc(slices.Clone(writes), func(w harness.Write) bool { return w.Status == 409 }); len(ok) != 1 || ok[0].Status != 200 {
		t.Errorf("nodeguard's writes to the Deployment %+v, want one successful PATCH (and any others refused with 409)", writes)
	}
	t.Logf("writes to the Deployment: %+v", writes)
	// The node that did not restart says that it waits for the other's restart.
	var waited int
	for _, n := range c.targets {
		notes, err := harness.EventNotes(context.Background(), env.Client, n, "WaitingForReplacement")
		if err != nil {
			t.Fatal(err)
		}
		waited += len(notes)
	}
	if waited == 0 {
		t.Error("no WaitingForReplacement event on either node")
	}
}

// spreadOverNodes places a Deployment's pods at most one apart per node, on
// nodes whose taints they tolerate: 2 and 1 on two nodes, and the
// replacements on the untainted spares.
func spreadOverNodes(d *appsv1.Deployment) {
	d.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: d.Spec.Selector, NodeTaintsPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
}

// TestStatefulSetUnderBlockedPDBWaits: a StatefulSet pod under minAvailable:
// 1 is not restarted; the event and the node condition name the PDB and the
// policy. Once the PDB is relaxed, the drain goes on.
func TestStatefulSetUnderBlockedPDBWaits(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	c := newReplaceCluster(t, "sts", 1, func(ns string) {
		labels := map[string]string{"app": "db"}
		harness.MustCreate(t, env.Client, &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
			Spec: appsv1.StatefulSetSpec{
				Replicas: ptr.To[int32](1), ServiceName: "db",
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"pool": ns},
					Containers:                    []corev1.Container{{Name: "db", Image: "registry.k8s.io/pause:3.10"}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				}},
			},
		})
		harness.MustCreate(t, env.Client, builder.PDB(ns, "db", builder.MinAvailable("1")))
	})
	target := c.targets[0]
	old := c.waitReadyOnTargets(t, "db", 1)
	var sts appsv1.StatefulSet
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: "db"}, &sts); err != nil {
		t.Fatal(err)
	}
	conditions := watchCondition(t, target)

	c.deleteTargets(t)
	waitForEventNote(t, target, "DrainBlockedByBudget", "pod "+c.ns+"/"+old[0], "PDB "+c.ns+"/db",
		"blocked-pdb-policy wait", "StatefulSet "+c.ns+"/db is never restarted")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		cond, err := nodeCondition(ctx, target)
		return cond != nil && containsAll(cond.Message, "PDB "+c.ns+"/db", "blocked-pdb-policy wait", "StatefulSet "+c.ns+"/db is never restarted", "relax the PDB"), err
	}, "the node condition names the PDB, the policy and what to do")
	var now appsv1.StatefulSet
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: "db"}, &now); err != nil {
		t.Fatal(err)
	}
	if now.Generation != sts.Generation {
		t.Errorf("the StatefulSet changed: generation %d, was %d", now.Generation, sts.Generation)
	}
	c.requireUntouched(t, old)
	if w := c.proxy.Writes("", "/apis/apps/"); len(w) != 0 {
		t.Errorf("nodeguard wrote to apps resources: %+v", w)
	}
	if gone, _ := harness.NodeGone(context.Background(), env.Client, target); gone {
		t.Fatal("the node was released while the StatefulSet pod's PDB allowed no disruption")
	}

	// Relaxed, the PDB lets the drain go on.
	if err := env.Client.Delete(context.Background(), &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "db"}}); err != nil {
		t.Fatal(err)
	}
	c.waitReleased(t, 2*time.Minute)
	conditions.requireWaiting(t, "Draining", "under PDB "+c.ns+"/db", "blocked by design", "blocked-pdb-policy wait")
}

// TestBlockedPDBPolicyWaitNeverTouchesTheDeployment: under
// --blocked-pdb-policy=wait a Deployment under a blocked-by-design PDB is never
// touched, while one annotated nodeguard.io/blocked-pdb-policy: replace on the
// same node is replaced.
func TestBlockedPDBPolicyWaitNeverTouchesTheDeployment(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	c := newReplaceCluster(t, "policywait", 1, func(ns string) {
		optIn := builder.Deployment(ns, "optin", 1, builder.OnNodes("pool", ns))
		optIn.Annotations = map[string]string{ngv1alpha1.BlockedPDBPolicyAnnotation: "replace"}
		for _, d := range []*appsv1.Deployment{builder.Deployment(ns, "web", 1, builder.OnNodes("pool", ns)), optIn} {
			harness.MustCreate(t, env.Client, d)
			harness.MustCreate(t, env.Client, builder.PDB(ns, d.Name, builder.MinAvailable("1")))
		}
	}, "--blocked-pdb-policy=wait")
	target := c.targets[0]
	web := c.waitReadyOnTargets(t, "web", 1)
	optIn := c.waitReadyOnTargets(t, "optin", 1)
	generation := deploymentOf(t, c.ns, "web").Generation
	ready := watchReady(t, c.ns, "optin")

	c.deleteTargets(t)
	waitForEventNote(t, target, "DrainBlockedByBudget", "pod "+c.ns+"/"+web[0], "PDB "+c.ns+"/web", "blocked-pdb-policy wait (--blocked-pdb-policy)")
	// The opted-in Deployment is replaced meanwhile.
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		names, err := c.readyPods(ctx, "optin")
		return len(names) == 0, err
	}, "the opted-in Deployment's pod leaves the node")
	// A few more drain passes, and web is still untouched.
	passes := c.passes.of(target)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return c.passes.of(target) >= passes+3, nil
	}, "3 more drain passes")
	d := deploymentOf(t, c.ns, "web")
	if d.Generation != generation || d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation] != "" {
		t.Errorf("the Deployment was touched under --blocked-pdb-policy=wait: generation %d (was %d), template annotations %v", d.Generation, generation, d.Spec.Template.Annotations)
	}
	if w := c.deploymentWrites("web"); len(w) != 0 {
		t.Errorf("nodeguard wrote to the Deployment under --blocked-pdb-policy=wait: %+v", w)
	}
	if w := c.deploymentWrites("optin"); len(w) != 1 {
		t.Errorf("nodeguard's writes to the opted-in Deployment %+v, want one PATCH", w)
	}
	c.requireUntouched(t, append(web, optIn...))
	ready.require(t, 1)
	// The decision changes the message within the phase: written within
	// conditionRefresh of the last.
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		cond, err := nodeCondition(ctx, target)
		return cond != nil && containsAll(cond.Message, "PDB "+c.ns+"/web", "blocked-pdb-policy wait (--blocked-pdb-policy)"), err
	}, "the node condition says why the drain waits")

	if err := env.Client.Delete(context.Background(), &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	c.waitReleased(t, 2*time.Minute)
}
