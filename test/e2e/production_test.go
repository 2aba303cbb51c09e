package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// What every AKS node carries, besides the workloads: a kube-proxy-like
// DaemonSet that tolerates every taint, a CSI-node-like DaemonSet with a
// VolumeAttachment, and a system-critical Deployment.

// allTolerating is a DaemonSet whose pods tolerate every taint: the DaemonSet
// controller puts a new one back on the node as soon as one is evicted.
func allTolerating(ns, name, pool string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"pool": pool},
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					PriorityClassName:             "system-node-critical",
					Containers:                    []corev1.Container{{Name: "agent", Image: "registry.k8s.io/pause:3.10"}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
}

func systemCritical(d *appsv1.Deployment) {
	d.Spec.Template.Spec.PriorityClassName = "system-cluster-critical"
}

// nodeCondition returns nodeguard's Terminating condition of a node, if any.
func nodeCondition(ctx context.Context, name string) (*corev1.NodeCondition, error) {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == ngv1alpha1.TerminatingCondition {
			return &n.Status.Conditions[i], nil
		}
	}
	return nil, nil
}

// TestProductionNodeDrainsInTiersAndIsReleased deletes a node carrying what an
// AKS node carries. Evictions follow the tiers (workloads, then
// system-critical pods, then DaemonSet pods), the tolerate-all DaemonSet pod
// is evicted once and its replacement ignored, the node is released within 2
// drain passes after its last workload pod is gone, kubectl describe node
// says what the drain waits for, and the maintenance Lease goes with the node.
func TestProductionNodeDrainsInTiersAndIsReleased(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	ns := freshName("aks")
	target := ns + "-target"
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pool := &azurePool{pool: ns}
	node := func(name string, i int) *corev1.Node { return pool.node(name, 40+i, fmt.Sprintf("10.60.0.%d", i+4)) }
	harness.MustCreate(t, env.Client, node(target, 0))
	onPool := builder.OnNodes("pool", ns)
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 3, onPool))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MaxUnavailable("1")))
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "coredns", 2, onPool, systemCritical))
	harness.MustCreate(t, env.Client, allTolerating(ns, "proxy", ns))
	harness.MustCreate(t, env.Client, allTolerating(ns, "csi", ns))
	attachment := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-disk"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "disk.csi.azure.com", NodeName: target,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-" + ns)}},
	}
	harness.MustCreate(t, env.Client, attachment)
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, ns, target)
		ready := 0
		for i := range pods {
			if harness.PodReady(&pods[i]) {
				ready++
			}
		}
		return ready == 3+2+2, err
	}, "web, coredns and both DaemonSets' pods run on %s", target)
	// Room for the evicted pods.
	harness.MustCreate(t, env.Client, node(ns+"-spare", 1))
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, pool.vms, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })

	proxy := startAPIProxy(t)
	_, counter := startNodeguardCountingPasses(t, proxy.Kubeconfig, emu)
	harness.WaitForTerminationFinalizer(t, env.Client, target)
	conditions := watchCondition(t, target)
	tiers := watchTiers(t, ns, target, aksTier)
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", target, "--wait=false")

	// The last workload pod gone, the drain ends and the node waits for its
	// volume: kubectl describe node says so. (The PDB's waits here last less
	// than the 3 s a status change waits before it is written.) Then the CSI
	// driver detaches the volume, and the node goes within the passes those
	// changes cause, with no poll between.
	var passesAtLastWorkload int
	harness.Eventually(t, 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, ns, target)
		if slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Labels["app"] == "web" || p.Labels["app"] == "coredns" }) {
			return false, err
		}
		passesAtLastWorkload = counter.of(target)
		return err == nil, err
	}, "every workload pod leaves %s", target)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		c, err := nodeCondition(ctx, target)
		return c != nil && c.Reason == "WaitingForVolumeDetach" && strings.Contains(c.Message, attachment.Name), err
	}, "node %s carries the %s condition naming the VolumeAttachment it waits for", target, ngv1alpha1.TerminatingCondition)
	if out := harness.MustKubectl(t, env.Kubeconfig, "", "describe", "node", target); !strings.Contains(out, string(ngv1alpha1.TerminatingCondition)) {
		t.Errorf("kubectl describe node does not show %s:\n%s", ngv1alpha1.TerminatingCondition, out)
	}
	if err := env.Client.Delete(ctx, attachment); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, target)
	}, "node %s is released", target)
	counter.settled()
	passes := counter.of(target) - passesAtLastWorkload
	t.Logf("%d passes after the last workload pod was gone", passes)
	if passes > passesAfterLastWorkload {
		t.Errorf("%d passes after the last workload pod was gone, want at most %d", passes, passesAfterLastWorkload)
	}

	// The tiers, from the order evictions were sent.
	var order []string
	evictedProxies := 0
	for _, e := range proxy.Evictions(ns) {
		tier := map[string]string{"web": "workload", "coredns": "critical"}[e.Workload]
		if strings.HasPrefix(e.Pod, "proxy-") || strings.HasPrefix(e.Pod, "csi-") {
			tier = "daemonset"
		}
		if strings.HasPrefix(e.Pod, "proxy-") {
			evictedProxies++
		}
		if len(order) == 0 || order[len(order)-1] != tier {
			order = append(order, tier)
		}
	}
	if want := []string{"workload", "critical", "daemonset"}; !slices.Equal(order, want) {
		t.Errorf("eviction tiers in order %v, want %v", order, want)
	}
	if evictedProxies != 1 {
		t.Errorf("the tolerate-all DaemonSet pod got %d evictions, want 1 (its replacement ignored): %+v", evictedProxies, proxy.Evictions(ns))
	}
	tiers.check(t, 2)
	conditions.requireWaiting(t, "WaitingForVolumeDetach", attachment.Name)
	waitLeaseGone(t, target)
}

// passesAfterLastWorkload bounds the passes of a node, each woken by a
// change, between its last workload pod going and its release: the pass that
// evicts the DaemonSet tier, one for each of the two pods' changes as they
// terminate and go (four; a loaded machine delivers them apart, an idle one
// often two at once: 2026-11-29's CI counted 7 passes, runs alone 4 and 5;
// the last finds the node empty and marks it drained), the one the drained
// mark wakes (it waits for the volume) and the one the VolumeAttachment's
// going wakes; and, as the test waits for the volume wait's condition
// (written by the node's timer once the wait has lasted 3 s, not by a pass),
// at most one backstop a drain pass asked for before the drain ended.
// A drain that polled every second would add a pass a second of the several
// this takes; the node's heartbeats and nodeguard's own condition writes
// wake none.
const passesAfterLastWorkload = 8

// aksTier is the eviction tier of a pod of the production topology: ordinary
// workloads, then system-critical ones, then DaemonSet pods.
func aksTier(p *corev1.Pod) int {
	switch owner := metav1.GetControllerOf(p); {
	case owner != nil && owner.Kind == "DaemonSet":
		return 2
	case strings.HasPrefix(p.Spec.PriorityClassName, "system-"):
		return 1
	}
	return 0
}

// TestDeadNodeIsReleased deletes a node whose kubelet is gone (no kwok, Ready
// Unknown) while it carries 3 pods: evicted, they stay Terminating, since no
// kubelet confirms them. The drain gives up on them (with an event naming
// each) and releases the node within the pods' grace period + the stuck-pod
// margin + 30 s (in fact within seconds: an unreachable node's pods are waited
// for only a short margin); the pod garbage collector finishes them, as after
// a plain kubectl delete node.
func TestDeadNodeIsReleased(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const grace, margin = 30 * time.Second, finalizerStuckPodMargin
	dead := newDeadNode(t, freshName("dead"), grace)
	took := dead.deleteAndWaitReleased(t, grace+margin+30*time.Second)
	t.Logf("dead node released %s after its delete", took.Round(time.Second))
	// nodeguard's recorder writes events from its queues, after the
	// release that follows them: wait for the third, then count.
	var gaveUp int
	harness.Eventually(t, harness.EventTimeout, func(ctx context.Context) (bool, error) {
		var err error
		gaveUp, err = harness.CountEvents(ctx, env.Client, dead.node, "DrainGaveUpOnPod")
		return gaveUp >= 3, err
	}, "3 DrainGaveUpOnPod events about %s", dead.node)
	if gaveUp != 3 {
		t.Errorf("%d DrainGaveUpOnPod events, want one per pod: 3", gaveUp)
	}
	dead.conditions.requireWaiting(t, "Draining", "Drain not completed yet", "Pods ", "deletionTimestamp set, but still not removed from the Node")
	waitLeaseGone(t, dead.node)
}

// TestDeadNodeOutOfServiceIsReleasedSooner: with the out-of-service taint (an
// administrator's word that the node is shut down, non-graceful shutdown),
// the dead node goes before its pods' grace period is even over.
func TestDeadNodeOutOfServiceIsReleasedSooner(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const grace = 30 * time.Second
	dead := newDeadNode(t, freshName("outofservice"), grace)
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: dead.node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	if err := env.Client.Patch(context.Background(), &n, patch); err != nil {
		t.Fatal(err)
	}
	took := dead.deleteAndWaitReleased(t, grace)
	t.Logf("out-of-service dead node released %s after its delete", took.Round(time.Second))
	// The pod garbage collector deletes the pods of a gone node once it has
	// been missing for its quarantine (40 s), checked every 20 s: 40–60 s.
	harness.Eventually(t, podGCOrphanBound, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, dead.ns, dead.node)
		return len(pods) == 0, err
	}, "the pod garbage collector removed the pods of the released node")
	waitLeaseGone(t, dead.node)
}

// podGCOrphanBound is how long kube-controller-manager's pod garbage
// collector may take to delete the pods of a deleted node: its quarantine
// (40 s) plus its period (20 s), with room for a loaded machine.
const podGCOrphanBound = 90 * time.Second

// finalizerStuckPodMargin is nodeguard's default --stuck-pod-margin.
const finalizerStuckPodMargin = time.Minute

// deadNode is a node whose kubelet is gone, with 3 pods bound to it, and
// nodeguard running.
type deadNode struct {
	ns, node   string
	conditions *conditionLog
}

func newDeadNode(t *testing.T, ns string, grace time.Duration) *deadNode {
	t.Helper()
	node := ns + "-node"
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	// What its kubelet last reported: room for pods, then silence.
	capacity := func(n *corev1.Node) {
		n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")}
		n.Status.Allocatable = n.Status.Capacity
	}
	harness.MustCreate(t, env.Client, builder.Node(node, builder.WithoutKubelet(), builder.Unreachable(), capacity, builder.WithLabels("pool", ns)))
	// Placed before the node lifecycle controller taints the node (or
	// tolerating it), as pods that ran there before the kubelet died.
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "stranded", 3, builder.OnNodes("pool", ns), func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To(int64(grace.Seconds()))
		d.Spec.Template.Spec.Tolerations = []corev1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists},
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists},
		}
	}))
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, ns, node)
		return len(pods) == 3, err
	}, "3 pods are bound to the dead node")

	emu, err := armemulator.Start("127.0.0.1:0", armemulator.Seed{Subscription: subscription, ResourceGroup: resourceGroup}, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	startNodeguard(t, env.Kubeconfig, emu, "--admin-state-timeout=2s")
	harness.WaitForTerminationFinalizer(t, env.Client, node)
	return &deadNode{ns: ns, node: node, conditions: watchCondition(t, node)}
}

// deleteAndWaitReleased deletes the node with kubectl and waits, at most
// within, until it is gone; it returns how long that took.
func (d *deadNode) deleteAndWaitReleased(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	deleted := time.Now()
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", d.node, "--wait=false")
	harness.Eventually(t, within, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, d.node)
	}, "the dead node %s is released", d.node)
	return time.Since(deleted)
}
