package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// fleet is a few nodes of one pool, without workloads, behind an emulated
// AKS resource group (NIC-based public pool, IP-based internal pool).
type fleet struct {
	pool     string
	nodes    []string
	vms      map[string]int // node → VMSS instance
	emulator *armemulator.Server
}

// fleetVMs numbers the VMs of every fleet in this process: nodes of earlier
// fleets stay in the cluster, and a later fleet's node with the same VM or IP
// would share its backend entries.
var fleetVMs = 1000

func newFleet(t *testing.T, name string, size int) *fleet {
	t.Helper()
	f := &fleet{pool: freshName(name), vms: map[string]int{}}
	var emuNodes []armemulator.Node
	for i := range size {
		vm := fleetVMs
		fleetVMs++
		node := fmt.Sprintf("%s-%d", f.pool, i)
		ip := fmt.Sprintf("10.201.%d.%d", vm/200, vm%200+4)
		f.nodes = append(f.nodes, node)
		f.vms[node] = vm
		emuNodes = append(emuNodes, armemulator.Node{Name: node, IPs: []string{ip}, ProviderID: vmssProviderID(vm)})
		harness.MustCreate(t, env.Client, builder.Node(node, builder.WithLabels("pool", f.pool),
			builder.WithProviderID(vmssProviderID(vm)), builder.WithInternalIP(ip)))
	}
	emu, err := armemulator.Start("127.0.0.1:0",
		armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{NICBased: true, Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	f.emulator = emu
	return f
}

// entries returns the node's load-balancer entries, by "lb/pool" (the
// outbound-only pool left out: it carries no admin state).
func (f *fleet) entries(node string) map[string]armemulator.EntryState {
	index := strconv.Itoa(f.vms[node])
	out := map[string]armemulator.EntryState{}
	for _, p := range f.emulator.State() {
		if p.Pool == "aksOutboundBackendPool" {
			continue
		}
		for _, e := range p.Entries {
			if e.Name == node || e.IP == "" && strings.Contains(e.IPConfigID, "/virtualMachines/"+index+"/") {
				out[p.LoadBalancer+"/"+p.Pool] = e
			}
		}
	}
	return out
}

// states returns the node's load-balancer entries' admin states, by
// "lb/pool".
func (f *fleet) states(node string) map[string]string {
	out := map[string]string{}
	for pool, e := range f.entries(node) {
		out[pool] = e.AdminState
	}
	return out
}

func (f *fleet) allStates(node, want string) bool {
	states := f.states(node)
	for _, s := range states {
		if s != want {
			return false
		}
	}
	return len(states) > 0
}

// patchTaints changes a node's taints with an optimistic lock, retrying on a
// conflict as taint writers do (nodeguard writes the node's annotations too).
func patchTaints(t *testing.T, node string, change func([]corev1.Taint) []corev1.Taint) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n corev1.Node
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
		n.Spec.Taints = change(n.Spec.Taints)
		return env.Client.Patch(context.Background(), &n, patch)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestClusterAutoscalerTaintIsASignal: cluster-autoscaler's scale-down taint
// (a default --signal-taints entry) takes the node's entries Down in one ARM
// round trip, one GET and one PUT per pool that holds the node, with no other
// node touched; removing it (a cancelled scale-down) restores None.
func TestClusterAutoscalerTaintIsASignal(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	f := newFleet(t, "casignal", 2)
	target, bystander := f.nodes[0], f.nodes[1]
	startNodeguard(t, env.Kubeconfig, f.emulator)
	harness.WaitForTerminationFinalizer(t, env.Client, target)
	pools := len(f.states(target))
	if pools != 2 {
		t.Fatalf("the node is in pools %v, want the public and the internal load balancer's", f.states(target))
	}
	f.emulator.ResetRequests()

	taint := corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey, Value: fmt.Sprint(time.Now().Unix()), Effect: corev1.TaintEffectNoSchedule}
	tainted := time.Now()
	patchTaints(t, target, func(ts []corev1.Taint) []corev1.Taint { return append(ts, taint) })
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return f.allStates(target, "Down"), nil
	}, "%s's entries are Down", target)
	t.Logf("Down %s after the taint", time.Since(tainted).Round(time.Millisecond))
	if puts := f.emulator.Count(http.MethodPut, "/backendAddressPools/"); puts != pools {
		t.Errorf("%d pool PUTs, want one round trip: one per pool holding the node (%d)", puts, pools)
	}
	if !f.allStates(bystander, "None") {
		t.Errorf("bystander %s: %v, want None", bystander, f.states(bystander))
	}

	patchTaints(t, target, func(ts []corev1.Taint) []corev1.Taint {
		var out []corev1.Taint
		for _, x := range ts {
			if x.Key != taint.Key {
				out = append(out, x)
			}
		}
		return out
	})
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return f.allStates(target, "None"), nil
	}, "%s's entries are back to None", target)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &n)
		_, held := n.Annotations[ngv1alpha1.AdminStateDownAnnotation]
		return err == nil && !held, err
	}, "%s is no longer held Down", target)
}

// cloudNodeController does what cloud-provider-azure's cloud node lifecycle
// controller does (kube-controller-manager no longer deletes nodes): every
// 5 s, for each node that is not Ready, it asks the cloud whether the VM
// exists and deletes the Node when it does not. A refused delete is retried
// at the next pass (the controller's DeletingNodeFailed event); refusals
// counts them.
type cloudNodeController struct {
	emulator *armemulator.Server
	pool     string
	refusals atomic.Int32
}

func (c *cloudNodeController) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			c.pass(ctx, t)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}()
}

func (c *cloudNodeController) pass(ctx context.Context, t *testing.T) {
	var nodes corev1.NodeList
	if err := env.Client.List(ctx, &nodes, client.MatchingLabels{"pool": c.pool}); err != nil {
		return
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.DeletionTimestamp != nil || nodeReady(n) || c.emulator.VMExists(n.Spec.ProviderID) {
			continue
		}
		if err := env.Client.Delete(ctx, n); client.IgnoreNotFound(err) != nil && ctx.Err() == nil {
			c.refusals.Add(1)
			t.Logf("cloud node controller: DeletingNodeFailed %s: %v", n.Name, err)
		}
	}
}

// TestCloudNodeControllerIsNeverRefused: a NotReady node whose VM is gone,
// carrying pods no kubelet will finish, under a budget that allows nothing
// (maxUnavailable 0, IfHealthyBudget: the unreachable-node rule alone would
// deny). The cloud node controller's first delete is admitted (nodeguard asked
// ARM for the VM) and the node is gone within 30 s: no drain is waited for.
func TestCloudNodeControllerIsNeverRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ns := freshName("cloudnode")
	node := ns + "-dead"
	providerID := vmssProviderID(7)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	capacity := func(n *corev1.Node) {
		n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")}
		n.Status.Allocatable = n.Status.Capacity
	}
	harness.MustCreate(t, env.Client, builder.Node(node, builder.WithoutKubelet(), builder.Unreachable(), capacity,
		builder.WithLabels("pool", ns), builder.WithProviderID(providerID), builder.WithInternalIP("10.77.0.7")))
	harness.MustCreate(t, env.Client, builder.NDB(ns, builder.NDBSelecting("pool", ns), builder.NDBMaxUnavailable("0"),
		builder.NDBUnhealthyNodeDeletion(ngv1alpha1.IfHealthyBudget)))
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "stranded", 2, builder.OnNodes("pool", ns), func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(int64(120))
		d.Spec.Template.Spec.Tolerations = []corev1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists},
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists},
		}
	}))
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, ns, node)
		return len(pods) == 2, err
	}, "2 pods are bound to the dead node")

	emu, err := armemulator.Start("127.0.0.1:0",
		armemulator.SeedForNodes(subscription, resourceGroup, []armemulator.Node{{Name: node, IPs: []string{"10.77.0.7"}, ProviderID: providerID}},
			armemulator.Topology{NICBased: true, Internal: true}),
		armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	startNodeguard(t, env.Kubeconfig, emu)
	harness.WaitForTerminationFinalizer(t, env.Client, node)

	if !emu.DeleteVM(providerID) {
		t.Fatalf("the emulator held no VM %s", providerID)
	}
	deleted := time.Now()
	ccm := &cloudNodeController{emulator: emu, pool: ns}
	ccm.run(t)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, node)
	}, "the node %s whose VM is gone is deleted", node)
	t.Logf("gone %s after its VM", time.Since(deleted).Round(time.Millisecond))
	if n := ccm.refusals.Load(); n != 0 {
		t.Errorf("the cloud node controller was refused %d time(s), want never", n)
	}
	// Admitted because the VM is gone, and released without a drain.
	waitForEventNote(t, node, "NodeDeletionAdmitted", "its instance", "no longer exists")
	harness.WaitForEvent(t, env.Client, node, "InstanceGoneReleased")
}

// TestScaleDownDisabledWhileTheBudgetAllowsNone: while a budget allows no
// disruption, its managed nodes carry cluster-autoscaler's
// scale-down-disabled=true, so that cluster-autoscaler does not even pick
// them; once it allows again nodeguard removes what it set, and never touches
// a user's annotation (here "false", which nodeguard must not overwrite).
func TestScaleDownDisabledWhileTheBudgetAllowsNone(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	f := newFleet(t, "scaledown", 3)
	users := f.nodes[2]
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: users}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[ngv1alpha1.ScaleDownDisabledAnnotation] = "false"
	if err := env.Client.Patch(ctx, &n, patch); err != nil {
		t.Fatal(err)
	}
	ndb := builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("0"))
	harness.MustCreate(t, env.Client, ndb)
	startNodeguard(t, env.Kubeconfig, f.emulator)

	annotations := func(ctx context.Context, node string) (map[string]string, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
		return n.Annotations, err
	}
	for _, node := range f.nodes[:2] {
		harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
			a, err := annotations(ctx, node)
			return a[ngv1alpha1.ScaleDownDisabledAnnotation] == "true" && a[ngv1alpha1.ScaleDownDisabledByAnnotation] == f.pool, err
		}, "%s carries scale-down-disabled=true, set by nodeguard for budget %s", node, f.pool)
	}

	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ndb), ndb); err != nil {
		t.Fatal(err)
	}
	budgetPatch := client.MergeFrom(ndb.DeepCopy())
	builder.NDBMaxUnavailable("1")(ndb)
	if err := env.Client.Patch(ctx, ndb, budgetPatch); err != nil {
		t.Fatal(err)
	}
	for _, node := range f.nodes[:2] {
		harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
			a, err := annotations(ctx, node)
			_, disabled := a[ngv1alpha1.ScaleDownDisabledAnnotation]
			_, marked := a[ngv1alpha1.ScaleDownDisabledByAnnotation]
			return !disabled && !marked, err
		}, "%s no longer carries nodeguard's scale-down-disabled", node)
	}
	a, err := annotations(ctx, users)
	if err != nil {
		t.Fatal(err)
	}
	if a[ngv1alpha1.ScaleDownDisabledAnnotation] != "false" || a[ngv1alpha1.ScaleDownDisabledByAnnotation] != "" {
		t.Errorf("the user's annotation was touched: %v", a)
	}
}

// TestKarpenterNodeIsCutNotDrained: a node that carries Karpenter's
// termination finalizer (Karpenter drains it and deletes its instance) is
// deleted within its budget like any node (TestKarpenterNodeDeleteFollowsTheBudget
// has the refusal, with the real Karpenter); nodeguard cuts its traffic, does
// not evict a single pod, and lets go of the node once the cut is confirmed,
// leaving Karpenter's finalizer.
func TestKarpenterNodeIsCutNotDrained(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	f := newFleet(t, "karpenter", 2)
	node := f.nodes[0]
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Finalizers = append(n.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer)
	n.Labels["e2e-target"] = f.pool
	if err := env.Client.Patch(ctx, &n, patch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // what Karpenter does once it has drained the node, and nodeguard if it did not let go
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err == nil {
			patch := client.MergeFrom(n.DeepCopy())
			n.Finalizers = nil
			_ = env.AsNodeguard.Patch(ctx, &n, patch)
		}
	})
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.pool}})
	harness.MustCreate(t, env.Client, builder.Deployment(f.pool, "web", 2, builder.OnNodes("e2e-target", f.pool)))
	harness.MustCreate(t, env.Client, builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("1")))
	startNodeguard(t, env.Kubeconfig, f.emulator)
	harness.WaitForTerminationFinalizer(t, env.Client, node)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, f.pool, node)
		return len(pods) > 0, err
	}, "a pod runs on %s", node)
	before, err := evictablePodsOn(ctx, f.pool, node)
	if err != nil {
		t.Fatal(err)
	}

	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return env.Client.Delete(ctx, &n) == nil, nil // once the budget's status allows one
	}, "the Node delete of a Karpenter node is admitted within its budget")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
		return err == nil && !slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer), err
	}, "nodeguard lets go of %s", node)
	if !f.allStates(node, "Down") {
		t.Errorf("released with entries %v, want every one Down", f.states(node))
	}
	harness.WaitForEvent(t, env.Client, node, "ReleasedToKarpenter")
	after, err := evictablePodsOn(ctx, f.pool, node)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range after {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s is terminating: nodeguard drained a Karpenter node", p.Name)
		}
	}
	if len(after) < len(before) {
		t.Errorf("%d pods on the node before the delete, %d after: nodeguard drained a Karpenter node", len(before), len(after))
	}
	var kept corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &kept); err != nil {
		t.Fatal(err) // Karpenter's finalizer keeps it
	}
	if slices.ContainsFunc(kept.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.DrainingTaintKey }) {
		t.Errorf("nodeguard cordoned a Karpenter node (taints %v): Karpenter drains it", kept.Spec.Taints)
	}
}
