package taintwatch

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var (
	outOfService  = corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	cloudShutdown = corev1.Taint{Key: ngv1alpha1.CloudShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule}
	spotEviction  = SpotEvictionTaint()
	// The scale-down taints of cluster-autoscaler (value: the Unix time it
	// tainted) and Karpenter.
	autoscaler = corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey, Value: "1795000000", Effect: corev1.TaintEffectNoSchedule}
	karpenter  = corev1.Taint{Key: ngv1alpha1.KarpenterDisruptedTaintKey, Effect: corev1.TaintEffectNoSchedule}
	cordoned   = corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
)

func TestSignalTaintsSetDownAndRestoreNone(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	nodes := []testNode{
		vmssNode("sig-oos", 0), vmasNode("sig-shutdown", 1), vmssNode("sig-spot", 2),
		vmssNode("sig-two", 3), vmasNode("sig-bystander", 4),
		vmssNode("sig-ca", 5), vmssNode("sig-karpenter", 6),
	}
	emu := startEmulator(t, nodes...)
	for _, n := range nodes {
		createNode(t, n)
	}
	startNodeguard(t, emu, nodeguardOptions{maxRetries: 3})

	tests := []struct {
		name string
		node string
		// taints are added in order and removed in order; only the last
		// removal restores None.
		taints []corev1.Taint
	}{
		{name: "out-of-service", node: "sig-oos", taints: []corev1.Taint{outOfService}},
		{name: "cloud shutdown", node: "sig-shutdown", taints: []corev1.Taint{cloudShutdown}},
		{name: "spot eviction", node: "sig-spot", taints: []corev1.Taint{spotEviction}},
		{name: "two signals, the last removal restores", node: "sig-two", taints: []corev1.Taint{outOfService, spotEviction}},
		// Removing it is a cancelled scale-down.
		{name: "cluster-autoscaler scale-down", node: "sig-ca", taints: []corev1.Taint{autoscaler}},
		{name: "karpenter disruption", node: "sig-karpenter", taints: []corev1.Taint{karpenter}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, taint := range tt.taints {
				updateTaints(t, tt.node, withTaint(taint))
			}
			waitEntries(t, emu, tt.node, "Down")
			if !heldDown(getNode(t, tt.node)) {
				t.Errorf("node %s lacks %s while Down", tt.node, ngv1alpha1.AdminStateDownAnnotation)
			}
			for _, other := range nodes {
				if other.name != tt.node {
					wantEntries(t, emu, other.name, "None")
				}
			}

			for i, taint := range tt.taints {
				last := i == len(tt.taints)-1
				restoresBefore := testutil.ToFloat64(adminStateRequests.WithLabelValues(string(azure.AdminStateNone)))
				passes := reconciles(t, "signal-taint-watcher")
				updateTaints(t, tt.node, withoutTaint(taint.Key))
				if last {
					break
				}
				// The watcher reconciled the change and asked for nothing.
				harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
					return reconciles(t, "signal-taint-watcher") > passes, nil
				}, "the watcher sees the removal of %s", taint.Key)
				if got := testutil.ToFloat64(adminStateRequests.WithLabelValues(string(azure.AdminStateNone))); got != restoresBefore {
					t.Errorf("None was requested with %d signal taint(s) left", len(tt.taints)-i-1)
				}
				if !heldDown(getNode(t, tt.node)) {
					t.Errorf("node %s was released with a signal taint left", tt.node)
				}
				wantEntries(t, emu, tt.node, "Down")
			}
			waitEntries(t, emu, tt.node, "None")
			harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
				return !heldDown(getNode(t, tt.node)), nil
			}, "node %s is released", tt.node)
			for _, other := range nodes {
				wantEntries(t, emu, other.name, "None")
			}
			node := getNode(t, tt.node)
			waitEvent(t, node, ReasonAdminStateDownRequested)
			waitEvent(t, node, ReasonAdminStateReleased)
		})
	}
}

// A node nodeguard never took Down is not touched, even when another tool set
// its entries Down: nodeguard does not fight other writers.
func TestLeavesOtherToolsDownAlone(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	other := vmssNode("foreign-down", 0)
	emu := startEmulator(t, other)
	for _, pool := range []string{"kubernetes", "kubernetes-IPv6"} {
		for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
			setAdminState(emu, lb, pool, "Down")
		}
	}
	createNode(t, other)
	startNodeguard(t, emu, nodeguardOptions{resync: 200 * time.Millisecond})
	waitResyncs(t, emu, 3)
	wantEntries(t, emu, other.name, "Down")
	if got := puts(emu); got != 0 {
		t.Errorf("backend pool writes = %d, want 0", got)
	}
}

func setAdminState(emu *armemulator.Server, lb, pool, state string) {
	emu.MutatePool(lb, pool, func(p *armnetwork.BackendAddressPool) {
		for _, e := range p.Properties.LoadBalancerBackendAddresses {
			if e.Properties == nil {
				continue
			}
			if state == "" {
				e.Properties.AdminState = nil
				continue
			}
			s := armnetwork.LoadBalancerBackendAddressAdminState(state)
			e.Properties.AdminState = &s
		}
	})
}

func TestDeletedNodeCausesNoWriteAndReplacementIsNotDown(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	gone, stays := vmssNode("del-a", 0), vmssNode("del-b", 1)
	emu := startEmulator(t, gone, stays)
	old := createNode(t, gone)
	createNode(t, stays)
	startNodeguard(t, emu, nodeguardOptions{resync: 200 * time.Millisecond})

	updateTaints(t, gone.name, withTaint(outOfService))
	waitEntries(t, emu, gone.name, "Down")
	before := puts(emu)

	deleteNode(t, gone.name)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return testutil.ToFloat64(nodesHeldDown) == 0, nil
	}, "the watcher forgets the deleted node")
	waitResyncs(t, emu, 2)
	if got := puts(emu); got != before {
		t.Errorf("backend pool writes after the delete = %d, want none", got-before)
	}
	wantEntries(t, emu, gone.name, "Down") // nobody restored it

	// cloud-provider-azure removes a deleted node's entries and adds fresh
	// ones (no admin state) for a node that joins with its name.
	for _, pool := range []string{"kubernetes", "kubernetes-IPv6"} {
		for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
			resetEntries(emu, lb, pool, gone.name)
		}
	}
	replacement := createNode(t, gone)
	if replacement.UID == old.UID {
		t.Fatal("the replacement has the old node's UID")
	}
	waitResyncs(t, emu, 2)
	if got := puts(emu); got != before {
		t.Errorf("backend pool writes after the replacement joined = %d, want none", got-before)
	}
	wantEntries(t, emu, gone.name, "None")
	wantEntries(t, emu, stays.name, "None")
	if heldDown(getNode(t, gone.name)) {
		t.Errorf("the replacement node carries %s", ngv1alpha1.AdminStateDownAnnotation)
	}
}

// TestDeletingNodeIsTakenDownWithoutAWrite: a node deleted under nodeguard's
// finalizer goes Down with no write of the node and no event of the watcher:
// its deletion cannot be undone, so nothing restores None while it exists,
// and the termination controller cordons it (and reports the cut) meanwhile.
func TestDeletingNodeIsTakenDownWithoutAWrite(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	n := vmssNode("deleting-down", 7)
	emu := startEmulator(t, n)
	node := createNode(t, n)
	startNodeguard(t, emu, nodeguardOptions{})
	ctx := context.Background()
	patch := client.MergeFrom(node.DeepCopy())
	node.Finalizers = append(node.Finalizers, ngv1alpha1.TerminationFinalizer)
	if err := env.Client.Patch(ctx, node, patch); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeFinalizer(t, n.name) })
	if err := env.Client.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	deleting := getNode(t, n.name)

	waitEntries(t, emu, n.name, "Down")
	got := getNode(t, n.name)
	if heldDown(got) || got.ResourceVersion != deleting.ResourceVersion {
		t.Errorf("the deleting node was written (resourceVersion %s, then %s; annotations %v), want no write",
			deleting.ResourceVersion, got.ResourceVersion, got.Annotations)
	}
	if events, err := nodeEvents(t, got); err != nil || events[ReasonAdminStateDownRequested] > 0 {
		t.Errorf("events %v (%v), want no %s on a deleting node", events, err, ReasonAdminStateDownRequested)
	}
}

// removeFinalizer lets a node the test deleted under nodeguard's finalizer go.
func removeFinalizer(t *testing.T, name string) {
	t.Helper()
	node := getNode(t, name)
	patch := client.MergeFrom(node.DeepCopy())
	node.Finalizers = slices.DeleteFunc(node.Finalizers, func(f string) bool { return f == ngv1alpha1.TerminationFinalizer })
	if err := env.Client.Patch(context.Background(), node, patch); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

// resetEntries clears the admin state of a node's entries in a pool.
func resetEntries(emu *armemulator.Server, lb, pool, node string) {
	emu.MutatePool(lb, pool, func(p *armnetwork.BackendAddressPool) {
		for _, e := range p.Properties.LoadBalancerBackendAddresses {
			if e.Name != nil && (*e.Name == node || *e.Name == testRG+"-"+node) && e.Properties != nil {
				e.Properties.AdminState = nil
			}
		}
	})
}

func TestOutageConvergesAfterRecovery(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	n := vmssNode("outage", 0)
	emu := startEmulator(t, n)
	createNode(t, n)
	startNodeguard(t, emu, nodeguardOptions{resync: 500 * time.Millisecond, maxRetries: 1})
	waitResyncs(t, emu, 1)

	// Azure answers 503 for every backend pool request.
	heal := emu.AddFault(armemulator.Fault{Path: "/backendAddressPools/", Status: http.StatusServiceUnavailable})
	updateTaints(t, n.name, withTaint(outOfService))
	node := getNode(t, n.name)
	waitEvent(t, node, azure.ReasonUpdateFailed)
	wantEntries(t, emu, n.name, "None")

	heal()
	waitEntries(t, emu, n.name, "Down")
	waitEvent(t, node, ReasonAdminStateDownRequested)
	waitEvent(t, node, azure.ReasonDown)

	updateTaints(t, n.name, withoutTaint(outOfService.Key))
	waitEntries(t, emu, n.name, "None")
	waitEvent(t, node, ReasonAdminStateReleased)
}

func TestInputsChanged(t *testing.T) {
	deleting := metav1.Now()
	base := func(opts ...func(*corev1.Node)) *corev1.Node {
		n := builder.Node("n", builder.WithProviderID("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/n"),
			builder.WithInternalIP("10.0.0.1"), builder.Ready())
		for _, o := range opts {
			o(n)
		}
		return n
	}
	taint := func(ts ...corev1.Taint) func(*corev1.Node) {
		return func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, ts...) }
	}
	tests := []struct {
		name     string
		old, new *corev1.Node
		want     bool
	}{
		{"heartbeat", base(), base(func(n *corev1.Node) { n.Status.Conditions[0].LastHeartbeatTime = metav1.Now() }), false},
		{"label", base(), base(func(n *corev1.Node) { n.Labels["x"] = "y" }), false},
		{"cordon", base(), base(func(n *corev1.Node) { n.Spec.Unschedulable = true }, taint(cordoned)), false},
		{"other taint", base(), base(taint(corev1.Taint{Key: "example.com/x", Effect: corev1.TaintEffectNoSchedule})), false},
		{"spot key with another value", base(), base(taint(corev1.Taint{Key: ngv1alpha1.SpotEvictionTaintKey, Value: "other", Effect: corev1.TaintEffectNoSchedule})), false},
		{"out-of-service", base(), base(taint(outOfService)), true},
		{"cloud shutdown", base(), base(taint(cloudShutdown)), true},
		{"spot eviction", base(), base(taint(spotEviction)), true},
		{"draining", base(), base(taint(corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule})), true},
		{"second signal", base(taint(outOfService)), base(taint(outOfService, spotEviction)), true},
		{"deleting with finalizer", base(builder.WithFinalizers(ngv1alpha1.TerminationFinalizer)),
			base(builder.WithFinalizers(ngv1alpha1.TerminationFinalizer), func(n *corev1.Node) { n.DeletionTimestamp = &deleting }), true},
		{"record removed", base(func(n *corev1.Node) { n.Annotations[ngv1alpha1.AdminStateDownAnnotation] = "t" }), base(), true},
		{"new InternalIP", base(), base(builder.WithInternalIP("fd00::1")), true},
	}
	p := inputsChanged(azure.Signals{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.Update(event.UpdateEvent{ObjectOld: tt.old, ObjectNew: tt.new}); got != tt.want {
				t.Errorf("inputsChanged = %v, want %v", got, tt.want)
			}
		})
	}
}
