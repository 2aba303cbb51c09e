package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// budgets are the protected workloads: 4 replicas each, and how many of them
// must stay healthy.
var budgets = []struct {
	app        string
	pdb        func(*policyv1.PodDisruptionBudgetSpec)
	minHealthy int
}{
	{"one", builder.MaxUnavailable("1"), 3},
	{"two", builder.MaxUnavailable("2"), 2},
	{"most", builder.MinAvailable("75%"), 3},
}

// topology is a target node carrying every kind of pod, and spare nodes to
// take the evicted ones.
type topology struct {
	ns, target string
	spares     []string
	emulator   *armemulator.Server
}

func vmssProviderID(index int) string {
	return fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/e2e-vmss/virtualMachines/%d",
		subscription, resourceGroup, index)
}

// azurePool makes the nodes of a pool (label pool=<pool>), each a VM of the
// scale set with one internal IP, and keeps them for the ARM emulator's seed.
type azurePool struct {
	pool string
	vms  []armemulator.Node
}

// node is the pool's node name on VM vm (vmssProviderID) with address ip.
func (p *azurePool) node(name string, vm int, ip string) *corev1.Node {
	p.vms = append(p.vms, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: vmssProviderID(vm)})
	return builder.Node(name, builder.WithLabels("pool", p.pool), builder.WithProviderID(vmssProviderID(vm)), builder.WithInternalIP(ip))
}

// topologies counts the topologies made under each name in this process.
var topologies = map[string]int{}

// freshName is name the first time, then name2, name3...: -count=N runs a test
// N times on one cluster, and each run gets fresh names.
func freshName(name string) string {
	topologies[name]++
	if n := topologies[name]; n > 1 {
		return fmt.Sprintf("%s%d", name, n)
	}
	return name
}

// newTopology creates the target node and its pods, then the spare nodes,
// and an ARM emulator whose load balancers hold all of them. With doNotEvict,
// one of the pods is annotated nodeguard.io/do-not-evict.
func newTopology(t *testing.T, name string, doNotEvict bool) *topology {
	t.Helper()
	name = freshName(name)
	c := env.Client
	top := &topology{ns: name, target: name + "-target"}
	pool := &azurePool{pool: name}
	node := func(nodeName string, index int) *corev1.Node {
		return pool.node(nodeName, index, fmt.Sprintf("10.%d.0.%d", len(name), index+4))
	}
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	harness.MustCreate(t, env.Client, node(top.target, 0))
	onPool := builder.OnNodes("pool", name)
	for _, b := range budgets {
		harness.MustCreate(t, env.Client, builder.Deployment(name, b.app, 4, onPool))
		harness.MustCreate(t, env.Client, builder.PDB(name, b.app, b.pdb))
	}
	harness.MustCreate(t, env.Client, builder.Deployment(name, "free", 3, onPool))
	keep := builder.WithPodAnnotations("example.com/role", "keep")
	if doNotEvict {
		keep = builder.WithPodAnnotations(ngv1alpha1.DoNotEvictAnnotation, "true")
	}
	harness.MustCreate(t, env.Client, builder.Deployment(name, "keep", 1, onPool, keep))
	harness.MustCreate(t, env.Client, daemonSet(name))
	harness.MustCreate(t, env.Client, completedJob(name, top.target))
	harness.MustCreate(t, env.Client, mirrorPod(name, top.target))
	waitForPods(t, name, top.target, 4*len(budgets)+3+1+1+1) // + free, keep, daemon, mirror
	for i := range 3 {
		spare := fmt.Sprintf("%s-spare-%d", name, i)
		top.spares = append(top.spares, spare)
		harness.MustCreate(t, env.Client, node(spare, i+1))
	}
	emu, err := armemulator.Start("127.0.0.1:0",
		armemulator.SeedForNodes(subscription, resourceGroup, pool.vms, armemulator.Topology{NICBased: true, Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	top.emulator = emu
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		for _, b := range budgets {
			var pdb policyv1.PodDisruptionBudget
			if err := c.Get(ctx, client.ObjectKey{Namespace: name, Name: b.app}, &pdb); err != nil || pdb.Status.CurrentHealthy != 4 {
				return false, err
			}
		}
		return true, nil
	}, "every PDB sees its 4 pods healthy")
	return top
}

func daemonSet(ns string) *appsv1.DaemonSet {
	labels := map[string]string{"app": "daemon"}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "daemon"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"pool": ns},
					Containers:                    []corev1.Container{{Name: "agent", Image: "registry.k8s.io/pause:3.10"}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
}

func completedJob(ns, node string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "done"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "job", Image: "registry.k8s.io/pause:3.10"}},
		}}},
	}
}

func mirrorPod(ns, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "static-" + node, Annotations: map[string]string{"kubernetes.io/config.mirror": "e2e"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "static", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
}

// waitForPods waits until want pods run on the node and the job's pod completed.
func waitForPods(t *testing.T, ns, node string, want int) {
	t.Helper()
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		running, succeeded := 0, 0
		for _, p := range pods.Items {
			switch {
			case p.Spec.NodeName != node:
			case p.Status.Phase == corev1.PodRunning:
				running++
			case p.Status.Phase == corev1.PodSucceeded:
				succeeded++
			}
		}
		return running == want && succeeded == 1, nil
	}, "%d pods run on %s and the job's pod completed", want, node)
}

// evictablePodsOn lists the pods on the node that the drain must remove: not
// mirror pods, not finished pods.
func evictablePodsOn(ctx context.Context, ns, node string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Annotations["kubernetes.io/config.mirror"] == "" &&
			p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, p)
		}
	}
	return out, nil
}

// watchBudgets records every moment a protected workload of the topology had
// fewer healthy pods than its PDB requires.
func watchBudgets(t *testing.T, ns string) *podBudgetLog {
	t.Helper()
	minHealthy := map[string]int{}
	for _, b := range budgets {
		minHealthy[b.app] = b.minHealthy
	}
	return watchPodBudgets(t, ns, minHealthy)
}

// waitLeaseGone waits until the node's maintenance Lease is gone: it is owned
// by its node, so the garbage collector deletes it with the node.
func waitLeaseGone(t *testing.T, node string) {
	t.Helper()
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node}, &coordinationv1.Lease{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}, "the maintenance Lease of node %s goes with the node", node)
}

// releaseHeld deletes the target's do-not-evict pod (app=keep) and waits for
// the node to be released.
func (top *topology) releaseHeld(ctx context.Context, t *testing.T) {
	t.Helper()
	pods, err := evictablePodsOn(ctx, top.ns, top.target)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		if pods[i].Labels["app"] == "keep" {
			if err := env.Client.Delete(ctx, &pods[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, top.target)
	}, "the node is released once the do-not-evict pod is gone")
}
