package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Real Karpenter (v1.14.1, hack/tools/karpenter) with its kwok cloud
// provider: its instances are Node objects that it creates itself (named
// kwok-<nodeclaim>-…, providerID kwok://<node>) and that the cluster's kwok
// then plays; deleting the instance deletes the Node. The test plays what
// Azure's cloud-node-manager and service controller do for a new node: give
// it its own InternalIP (kwok would give every node the same one) and put it
// in the load balancers' IP-based backend pools, taking it out once the node
// is gone.

const karpenterInstanceType = "c-4x-amd64-linux" // 4 CPUs

var (
	nodePoolGVK  = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodePool"}
	nodeClaimGVK = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaim"}
	nodeClassGVK = schema.GroupVersionKind{Group: "karpenter.kwok.sh", Version: "v1alpha1", Kind: "KWOKNodeClass"}
)

// karpenterPool creates a KWOKNodeClass and a NodePool that consolidates
// (WhenEmptyOrUnderutilized, after 5 s), by default one node per command (its
// own disruption budget: nodes "1") and of one instance type. A wider
// Karpenter budget makes multi-node commands, and Karpenter v1.14.1 strands
// the candidates of such a command that nodeguard denies once the first
// candidate's NodeClaim is gone (docs/concepts.md, Who deletes nodes;
// TestKarpenterStrandedCandidatesServeAgain). Its nodes carry a taint only
// the test's pods tolerate, so pods of other tests neither land on them nor
// make Karpenter launch nodes.
func karpenterPool(t *testing.T, name string, opts ...func(*nodePoolSpec)) {
	t.Helper()
	spec := nodePoolSpec{instanceTypes: []string{karpenterInstanceType}, nodes: "1"}
	for _, opt := range opts {
		opt(&spec)
	}
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
	class.SetGroupVersionKind(nodeClassGVK)
	class.SetName(name)
	harness.MustCreate(t, env.Client, class)
	var types []any
	for _, it := range spec.instanceTypes {
		types = append(types, it)
	}
	pool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"template": map[string]any{"spec": map[string]any{
			"nodeClassRef": map[string]any{"group": nodeClassGVK.Group, "kind": nodeClassGVK.Kind, "name": name},
			"requirements": []any{
				map[string]any{"key": corev1.LabelInstanceTypeStable, "operator": "In", "values": types},
				map[string]any{"key": "karpenter.sh/capacity-type", "operator": "In", "values": []any{"on-demand"}},
			},
			"taints": []any{map[string]any{"key": karpenterTaintKey, "value": name, "effect": "NoSchedule"}},
		}},
		"disruption": map[string]any{
			"consolidationPolicy": "WhenEmptyOrUnderutilized",
			"consolidateAfter":    "5s",
			"budgets":             []any{map[string]any{"nodes": spec.nodes}},
		},
	}}}
	pool.SetGroupVersionKind(nodePoolGVK)
	pool.SetName(name)
	harness.MustCreate(t, env.Client, pool)
}

// nodePoolSpec is what tests vary in karpenterPool's NodePool.
type nodePoolSpec struct {
	instanceTypes []string
	nodes         string // its disruption budget
}

// setKarpenterBudget sets the NodePool's own disruption budget (nodes).
func setKarpenterBudget(t *testing.T, pool, nodes string) {
	t.Helper()
	np := &unstructured.Unstructured{}
	np.SetGroupVersionKind(nodePoolGVK)
	np.SetName(pool)
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"disruption":{"budgets":[{"nodes":%q}]}}}`, nodes)))
	if err := env.Client.Patch(context.Background(), np, patch); err != nil {
		t.Fatal(err)
	}
}

const karpenterTaintKey = "e2e.nodeguard.io/karpenter"

// onKarpenterPool puts a Deployment's pods on the NodePool's nodes, each
// requesting cpu. They tolerate the pool's taint only: a pod tolerating
// karpenter.sh/disrupted would not be drained by Karpenter.
func onKarpenterPool(pool, cpu string) builder.WorkloadOption {
	return func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.NodeSelector = map[string]string{"karpenter.sh/nodepool": pool}
		spec.Tolerations = []corev1.Toleration{{Key: karpenterTaintKey, Operator: corev1.TolerationOpEqual, Value: pool, Effect: corev1.TaintEffectNoSchedule}}
		spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
}

// karpenterIPs numbers the InternalIPs given to Karpenter's nodes in this
// process.
var karpenterIPs = 0

// cloudNodeManager plays, for the NodePool's nodes, cloud-node-manager
// (the node's InternalIP) and the service controller (the node's entries in
// the IP-based backend pools, removed once the node is gone). When it sees a
// node gone, it first notes whether all its entries were Down.
type cloudNodeManager struct {
	emulator *armemulator.Server
	pool     string

	mu  sync.Mutex
	ips map[string]string // node → InternalIP
	// gone: the nodes seen gone; notDown: those gone with an entry not Down.
	gone    []string
	notDown []string
}

// karpenterPools are the pools a node joins (lb/pool); the outbound-only pool
// carries no admin state.
var karpenterPools = [][2]string{{"kubernetes", "kubernetes"}, {"kubernetes-internal", "kubernetes"}, {"kubernetes", "aksOutboundBackendPool"}}

func (m *cloudNodeManager) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w := watchPool(t, ctx, &corev1.NodeList{}, m.pool)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done }) // before the watch stops
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if n.DeletionTimestamp == nil {
					m.register(ctx, t, n)
				}
			case watch.Deleted:
				m.unregister(n.Name)
			}
		}
		if ctx.Err() == nil {
			t.Errorf("the watch of the NodePool's nodes ended early: nodes may have gone unchecked")
		}
	}()
}

// register gives a new node its pool entries, then its InternalIP (what
// identifies it to nodeguard), and puts the IP back whenever the node shows
// another one.
func (m *cloudNodeManager) register(ctx context.Context, t *testing.T, n *corev1.Node) {
	m.mu.Lock()
	ip, ok := m.ips[n.Name]
	if !ok {
		karpenterIPs++
		ip = fmt.Sprintf("10.203.%d.%d", karpenterIPs/200, karpenterIPs%200+4)
		m.ips[n.Name] = ip
		for _, p := range karpenterPools {
			m.emulator.MutatePool(p[0], p[1], func(bp *armnetwork.BackendAddressPool) {
				bp.Properties.LoadBalancerBackendAddresses = append(bp.Properties.LoadBalancerBackendAddresses, &armnetwork.LoadBalancerBackendAddress{
					Name:       ptr.To(n.Name),
					Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: ptr.To(ip)},
				})
			})
		}
	}
	m.mu.Unlock()
	if slices.Contains(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}) {
		return
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: n.Name}}
	if err := env.Client.Status().Patch(ctx, n, patch); client.IgnoreNotFound(err) != nil && ctx.Err() == nil {
		t.Errorf("setting the InternalIP of %s: %v", n.Name, err)
	}
}

func (m *cloudNodeManager) unregister(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	states := m.states(node)
	m.gone = append(m.gone, node)
	if len(states) != 2 || states["kubernetes/kubernetes"] != "Down" || states["kubernetes-internal/kubernetes"] != "Down" {
		m.notDown = append(m.notDown, fmt.Sprintf("%s: %v", node, states))
	}
	for _, p := range karpenterPools {
		m.emulator.MutatePool(p[0], p[1], func(bp *armnetwork.BackendAddressPool) {
			bp.Properties.LoadBalancerBackendAddresses = slices.DeleteFunc(bp.Properties.LoadBalancerBackendAddresses,
				func(e *armnetwork.LoadBalancerBackendAddress) bool { return e.Name != nil && *e.Name == node })
		})
	}
}

// states returns the admin states of the node's entries by lb/pool, outbound
// pool left out.
func (m *cloudNodeManager) states(node string) map[string]string {
	out := map[string]string{}
	for _, p := range m.emulator.State() {
		if p.Pool == "aksOutboundBackendPool" {
			continue
		}
		for _, e := range p.Entries {
			if e.Name == node {
				out[p.LoadBalancer+"/"+p.Pool] = e.AdminState
			}
		}
	}
	return out
}

// watchPool watches the objects of list's kind labelled with the NodePool.
func watchPool(t *testing.T, ctx context.Context, list client.ObjectList, pool string) watch.Interface {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, list, client.MatchingLabels{"karpenter.sh/nodepool": pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// disruptionLog records every change of the NodePool's Nodes and NodeClaims
// as the API server ordered them (resourceVersion: one etcd revision for
// both), so that two watches delivering out of order cannot fake or hide an
// overlap.
type disruptionLog struct {
	mu      sync.Mutex
	changes []disruptionChange
}

// disruptionChange is one watch event: the instance (providerID) it is
// about, and whether it starts the instance's disruption (its NodeClaim or
// Node deleting) or ends it (the Node gone).
type disruptionChange struct {
	rv       uint64
	instance string
	node     string
	what     string // "NodeClaim deleting", "Node deleting", "Node gone"
}

func watchDisruptions(t *testing.T, pool string) *disruptionLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &disruptionLog{}
	claims := &unstructured.UnstructuredList{}
	claims.SetGroupVersionKind(nodeClaimGVK.GroupVersion().WithKind("NodeClaimList"))
	var wg sync.WaitGroup
	for _, w := range []watch.Interface{watchPool(t, ctx, &corev1.NodeList{}, pool), watchPool(t, ctx, claims, pool)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range w.ResultChan() {
				l.record(t, ev)
			}
			if ctx.Err() == nil {
				t.Errorf("a watch of the NodePool's objects ended early: disruptions may have gone unseen")
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return l
}

func (l *disruptionLog) record(t *testing.T, ev watch.Event) {
	obj, err := meta.Accessor(ev.Object)
	if err != nil {
		return
	}
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		t.Errorf("resourceVersion %q: %v", obj.GetResourceVersion(), err)
		return
	}
	c := disruptionChange{rv: rv}
	switch o := ev.Object.(type) {
	case *corev1.Node:
		c.instance, c.node = o.Spec.ProviderID, o.Name
		switch {
		case ev.Type == watch.Deleted:
			c.what = "Node gone"
		case o.DeletionTimestamp != nil:
			c.what = "Node deleting"
		}
	case *unstructured.Unstructured:
		c.instance, _, _ = unstructured.NestedString(o.Object, "status", "providerID")
		c.node, _, _ = unstructured.NestedString(o.Object, "status", "nodeName")
		if o.GetDeletionTimestamp() != nil {
			c.what = "NodeClaim deleting"
		}
	}
	if c.what == "" || c.instance == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changes = append(l.changes, c)
}

// replay orders the changes by resourceVersion and returns the most
// instances ever disrupted at once, the overlaps, and the nodes disrupted.
func (l *disruptionLog) replay() (most int, overlaps []string, disrupted []string) {
	l.mu.Lock()
	changes := slices.Clone(l.changes)
	l.mu.Unlock()
	sort.SliceStable(changes, func(i, j int) bool { return changes[i].rv < changes[j].rv })
	open := map[string]string{} // instance → node, disrupted and not yet gone
	gone := map[string]bool{}
	for _, c := range changes {
		switch {
		case gone[c.instance]:
		case c.what == "Node gone":
			gone[c.instance] = true
			delete(open, c.instance)
		case open[c.instance] == "":
			open[c.instance] = c.node
			disrupted = append(disrupted, c.node)
			if len(open) > 1 {
				overlaps = append(overlaps, fmt.Sprintf("at revision %d (%s of %s) disrupted at once: %v", c.rv, c.what, c.node, sortedValues(open)))
			}
		case c.node != "":
			open[c.instance] = c.node
		}
		most = max(most, len(open))
	}
	return most, overlaps, disrupted
}

func sortedValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// TestKarpenterConsolidationFollowsTheBudget runs real Karpenter: a NodePool
// that consolidates, four nodes launched for a workload, then the workload
// that held them scaled to zero, so that Karpenter consolidates the small
// pods left onto one node. A NodeDisruptionBudget over the NodePool's nodes
// first allows nothing: Karpenter's NodeClaim deletes are denied, retried,
// and nothing is disrupted. Then it allows one (maxUnavailable 1): never
// more than one node disrupted at once (its NodeClaim or Node deleting, until
// the Node is gone), each one's entries Down before its instance (for kwok,
// the Node) is gone, every pod evicted once, by Karpenter only (nodeguard
// does not drain a node Karpenter terminates), and every consolidated node
// released (ReleasedToKarpenter, budget charge returned).
func TestKarpenterConsolidationFollowsTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	harness.InstallKarpenterCRDs(t, env.Client)
	pool := freshName("karpenter")
	emu := karpenterEmulator(t)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	harness.MustCreate(t, env.Client, builder.NDB(pool, builder.NDBSelecting("karpenter.sh/nodepool", pool), builder.NDBMaxUnavailable("0")))

	ngProxy, kpProxy := startAPIProxy(t), startAPIProxy(t)
	startNodeguard(t, ngProxy.Kubeconfig, emu)
	m := &cloudNodeManager{emulator: emu, pool: pool, ips: map[string]string{}}
	m.run(t)
	disruptions := watchDisruptions(t, pool)
	harness.StartKarpenter(t, kpProxy.Kubeconfig)
	karpenterPool(t, pool)
	t.Cleanup(func() { removeKarpenterPool(t, pool) })

	// Four nodes: each "hog" pod takes 3 of a node's 4 CPUs; then one small
	// "web" pod lands beside each.
	harness.MustCreate(t, env.Client, builder.Deployment(pool, "hog", 4, onKarpenterPool(pool, "3")))
	nodes := waitForRunning(t, pool, "hog", 4, 3*time.Minute)
	harness.MustCreate(t, env.Client, builder.Deployment(pool, "web", 4, onKarpenterPool(pool, "400m")))
	harness.MustCreate(t, env.Client, builder.PDB(pool, "web", builder.MaxUnavailable("1")))
	waitForRunning(t, pool, "web", 4, time.Minute)
	t.Logf("Karpenter launched %d nodes: %v", len(nodes), nodes)

	scale(t, pool, "hog", 0)
	// Karpenter tries a delete up to 4 times (client-go's DefaultBackoff),
	// then its disruption queue retries a second later: 5 denials mean the
	// queue retried.
	harness.Eventually(t, 2*time.Minute, func(context.Context) (bool, error) {
		return len(deniedNodeClaimDeletes(kpProxy)) >= 5, nil
	}, "Karpenter's NodeClaim delete is denied, and retried by its queue, while the budget allows nothing")
	if _, _, disrupted := disruptions.replay(); len(disrupted) > 0 {
		t.Errorf("nodes disrupted while the budget allowed nothing: %v", disrupted)
	}

	start := time.Now()
	setMaxUnavailable(t, pool, 1)
	harness.Eventually(t, 4*time.Minute, func(ctx context.Context) (bool, error) {
		left, deleting, err := poolNodes(ctx, pool)
		if err != nil || deleting > 0 || len(left) > 1 {
			return false, err
		}
		running, err := runningPods(ctx, pool, "web")
		return len(running) == 4, err
	}, "Karpenter consolidates the four web pods onto one node")
	t.Logf("consolidated in %s once the budget allowed one node", time.Since(start).Round(100*time.Millisecond))

	most, overlaps, disrupted := disruptions.replay()
	t.Logf("disrupted one after another: %v (most at once: %d)", disrupted, most)
	for _, o := range overlaps {
		t.Errorf("two nodes disrupted at once: %s", o)
	}
	if len(disrupted) < 3 {
		t.Errorf("Karpenter disrupted %d node(s), want the 3 it consolidates", len(disrupted))
	}
	// The node watcher has seen every disrupted node go (Eventually above saw
	// them gone from the API).
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.gone) >= len(disrupted), nil
	}, "every disrupted node seen gone")
	m.mu.Lock()
	for _, d := range m.notDown {
		t.Errorf("instance gone while an entry was not Down: %s", d)
	}
	m.mu.Unlock()

	if ev := ngProxy.Evictions(pool); len(ev) > 0 {
		t.Errorf("nodeguard sent %d evictions: it must leave the drain of Karpenter's nodes to Karpenter", len(ev))
	}
	evicted := map[string]int{}
	for _, e := range kpProxy.Evictions(pool) {
		if e.Status/100 == 2 {
			evicted[e.Pod]++
		}
	}
	t.Logf("Karpenter evicted: %v", evicted)
	if len(evicted) == 0 {
		t.Errorf("Karpenter evicted no pod: no consolidation moved a pod")
	}
	for pod, n := range evicted {
		if n != 1 {
			t.Errorf("pod %s evicted %d times", pod, n)
		}
	}

	for _, node := range disrupted {
		harness.WaitForEvent(t, env.Client, node, "NodeClaimDeletionAdmitted")
		harness.WaitForEvent(t, env.Client, node, "ReleasedToKarpenter")
	}
	denied, err := countEventsOn(ctx, nodes, "NodeClaimDeletionDenied")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NodeClaim deletes denied by the budget: %d (%d NodeClaimDeletionDenied events)", len(deniedNodeClaimDeletes(kpProxy)), denied)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: pool}, &ndb)
		return err == nil && len(ndb.Status.DisruptedNodes) == 0 && ndb.Status.DisruptionsAllowed == 1, err
	}, "the budget charges no node and allows one disruption again")
}

// deniedNodeClaimDeletes are Karpenter's NodeClaim DELETEs that a budget
// denied: 403 (it allows no disruption at all) or 429 (not now).
func deniedNodeClaimDeletes(p *harness.APIProxy) []harness.Write {
	return slices.DeleteFunc(p.Writes(http.MethodDelete, "/apis/karpenter.sh/v1/nodeclaims/"), func(w harness.Write) bool {
		return w.Status != http.StatusForbidden && w.Status != http.StatusTooManyRequests
	})
}

// countEventsOn counts the events with the reason about any of the nodes.
func countEventsOn(ctx context.Context, nodes []string, reason string) (int, error) {
	total := 0
	for _, n := range nodes {
		c, err := harness.CountEvents(ctx, env.Client, n, reason)
		if err != nil {
			return 0, err
		}
		total += c
	}
	return total, nil
}

func setMaxUnavailable(t *testing.T, name string, v int) {
	t.Helper()
	ndb := &ngv1alpha1.NodeDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name}}
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"maxUnavailable":%d}}`, v)))
	if err := env.Client.Patch(context.Background(), ndb, patch); err != nil {
		t.Fatal(err)
	}
}

// poolNodes lists the NodePool's nodes and counts those being deleted.
func poolNodes(ctx context.Context, pool string) (names []string, deleting int, err error) {
	var nodes corev1.NodeList
	if err := env.Client.List(ctx, &nodes, client.MatchingLabels{"karpenter.sh/nodepool": pool}); err != nil {
		return nil, 0, err
	}
	for _, n := range nodes.Items {
		names = append(names, n.Name)
		if n.DeletionTimestamp != nil {
			deleting++
		}
	}
	return names, deleting, nil
}

// runningPods returns the nodes of the app's running pods that are not
// being deleted.
func runningPods(ctx context.Context, ns, app string) ([]string, error) {
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
		return nil, err
	}
	var nodes []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			nodes = append(nodes, p.Spec.NodeName)
		}
	}
	return nodes, nil
}

// waitForRunning waits until want pods of the app run, and returns their
// nodes (sorted, distinct).
func waitForRunning(t *testing.T, ns, app string, want int, timeout time.Duration) []string {
	t.Helper()
	var nodes []string
	harness.Eventually(t, timeout, func(ctx context.Context) (bool, error) {
		var err error
		nodes, err = runningPods(ctx, ns, app)
		return len(nodes) == want, err
	}, "%d %s pods run", want, app)
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

func scale(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)))
	if err := env.Client.Patch(context.Background(), d, patch); err != nil {
		t.Fatal(err)
	}
}

// removeKarpenterPool takes the NodePool's nodes away while Karpenter and
// nodeguard still run, so that no node of it outlives the test: the
// workloads and the budget go first, then the NodePool, whose NodeClaims
// Karpenter terminates.
func removeKarpenterPool(t *testing.T, pool string) {
	ctx := context.Background()
	_ = env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	_ = client.IgnoreNotFound(env.Client.Delete(ctx, &ngv1alpha1.NodeDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: pool}}))
	for _, gvk := range []schema.GroupVersionKind{nodePoolGVK, nodeClassGVK} {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(gvk)
		o.SetName(pool)
		if err := env.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting %s %s: %v", gvk.Kind, pool, err)
		}
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		left, _, err := poolNodes(ctx, pool)
		return len(left) == 0, err
	}, "Karpenter removes the NodePool's nodes")
}
