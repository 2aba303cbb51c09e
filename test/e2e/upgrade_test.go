package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// upgrader plays an AKS node-image upgrade of a pool as AKS runs one: a surge
// node first, then maxUnavailable nodes at a time, each cordoned, drained
// through the Eviction API with 429s retried until the drain timeout,
// reimaged in place (NotReady, then Ready with a new boot ID) and uncordoned;
// the surge node is deleted at the end.
type upgrader struct {
	ns, pool       string
	maxUnavailable int
	drainTimeout   time.Duration

	mu sync.Mutex
	// firstEviction is when the first eviction of each node that evicted
	// a pod was sent.
	firstEviction map[string]time.Time
}

// run upgrades the nodes; an error names the node whose drain timed out.
// The surge node joins the pool first and is deleted last (through
// nodeguard, as any node delete).
func (u *upgrader) run(ctx context.Context, nodes []string) error {
	surge := u.pool + "-surge"
	if err := env.Client.Create(ctx, builder.Node(surge, builder.WithLabels("pool", u.pool))); err != nil {
		return err
	}
	for batch := range slices.Chunk(nodes, u.maxUnavailable) {
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, node := range batch {
			wg.Go(func() { errs[i] = u.upgradeNode(ctx, node) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return u.deleteSurge(ctx, surge)
}

// deleteSurge deletes the surge node, retrying a 429 until the drain timeout:
// the last batch's nodes count against the budget until nodeguard sees them
// schedulable and Ready again.
func (u *upgrader) deleteSurge(ctx context.Context, surge string) error {
	deadline := time.Now().Add(u.drainTimeout)
	for {
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: surge}})
		if !apierrors.IsTooManyRequests(err) || time.Now().After(deadline) {
			return client.IgnoreNotFound(err)
		}
		time.Sleep(time.Second)
	}
}

func (u *upgrader) upgradeNode(ctx context.Context, name string) error {
	if err := setUnschedulable(ctx, name, true); err != nil {
		return err
	}
	if err := u.drain(ctx, name); err != nil {
		return err
	}
	if err := reimage(ctx, name); err != nil {
		return err
	}
	return setUnschedulable(ctx, name, false)
}

// drain evicts every pod of the node but DaemonSet and mirror pods, retrying
// 429s every second, until none is left or the drain timeout passes.
func (u *upgrader) drain(ctx context.Context, node string) error {
	deadline := time.Now().Add(u.drainTimeout)
	for time.Now().Before(deadline) {
		pods, err := evictablePodsOn(ctx, u.ns, node)
		if err != nil {
			return err
		}
		pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool {
			return p.DeletionTimestamp != nil || slices.ContainsFunc(p.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "DaemonSet" })
		})
		if len(pods) == 0 {
			return nil
		}
		for i := range pods {
			sent := time.Now()
			err := env.Client.SubResource("eviction").Create(ctx, &pods[i], &policyv1.Eviction{})
			switch {
			case err == nil:
				u.mu.Lock()
				if _, ok := u.firstEviction[node]; !ok {
					u.firstEviction[node] = sent
				}
				u.mu.Unlock()
			case apierrors.IsTooManyRequests(err), apierrors.IsNotFound(err):
			default:
				return fmt.Errorf("evicting %s from %s: %w", pods[i].Name, node, err)
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("Drain node %s failed when evicting pods: timed out after %s (Too many Requests)", node, u.drainTimeout)
}

// setUnschedulable cordons or uncordons the node, as kubectl does.
func setUnschedulable(ctx context.Context, name string, unschedulable bool) error {
	patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, unschedulable))
	return env.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, patch))
}

// reimage plays the reimage: the kubelet stops (NotReady), then comes back
// Ready with a new boot ID.
func reimage(ctx context.Context, name string) error {
	for _, ready := range []corev1.ConditionStatus{corev1.ConditionFalse, corev1.ConditionTrue} {
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
			return err
		}
		patch := client.MergeFrom(node.DeepCopy())
		for i := range node.Status.Conditions {
			if c := &node.Status.Conditions[i]; c.Type == corev1.NodeReady {
				c.Status, c.LastTransitionTime = ready, metav1.Now()
			}
		}
		if ready == corev1.ConditionTrue {
			node.Status.NodeInfo.BootID = string(uuid.NewUUID())
		}
		if err := env.Client.Status().Patch(ctx, &node, patch); err != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	return nil
}

// TestUpgradeActorStaysWithinTheBudget upgrades a pool of 4 nodes under a
// NodeDisruptionBudget of maxUnavailable 1 with an actor that does what AKS
// does, set to drain 2 nodes at once. The budget is never exceeded (the
// second node of a batch waits in 429s until the first is back), every node's
// entries are Down before its first eviction, and the only replica of a
// Deployment under minAvailable: 1 is surged (--blocked-pdb-policy=replace)
// so that every node's drain completes.
func TestUpgradeActorStaysWithinTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	ns := freshName("upgrade")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	var nodes []string
	var emuNodes []armemulator.Node
	for i := range 4 {
		name := fmt.Sprintf("%s-%d", ns, i)
		ip := fmt.Sprintf("10.80.%d.%d", len(ns), i+4)
		nodes = append(nodes, name)
		emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: vmssProviderID(80 + i)})
		harness.MustCreate(t, env.Client, builder.Node(name, builder.WithLabels("pool", ns), builder.WithProviderID(vmssProviderID(80+i)), builder.WithInternalIP(ip)))
	}
	// The spread counts only nodes that take pods: every node Ready first.
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		for _, name := range nodes {
			var node corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil || !nodeReady(&node) || len(node.Spec.Taints) > 0 {
				return false, err
			}
		}
		return true, nil
	}, "every node of the pool is Ready and untainted")
	onPool := builder.OnNodes("pool", ns)
	web := builder.Deployment(ns, "web", 8, onPool)
	spreadOverNodes(web)
	harness.MustCreate(t, env.Client, web)
	harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MaxUnavailable("1")))
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "solo", 1, onPool))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "solo", builder.MinAvailable("1")))
	harness.MustCreate(t, env.Client, allTolerating(ns, "proxy", ns))
	harness.MustCreate(t, env.Client, builder.NDB(ns, builder.NDBSelecting("pool", ns), builder.NDBMaxUnavailable("1")))
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pdbs policyv1.PodDisruptionBudgetList
		err := env.Client.List(ctx, &pdbs, client.InNamespace(ns))
		healthy := 0
		for _, p := range pdbs.Items {
			if p.Status.CurrentHealthy == p.Status.ExpectedPods && p.Status.ExpectedPods > 0 {
				healthy++
			}
		}
		return healthy == 2, err
	}, "every pod of the pool runs")
	startNodeguard(t, env.Kubeconfig, emu, "--blocked-pdb-policy=replace")
	charged := watchCharged(t, ns)
	waitForBudgetAllowed(t, ns, 1)

	u := &upgrader{ns: ns, pool: ns, maxUnavailable: 2, drainTimeout: 3 * time.Minute, firstEviction: map[string]time.Time{}}
	started := time.Now()
	if err := u.run(ctx, nodes); err != nil {
		t.Fatalf("the upgrade failed: %v", err)
	}
	t.Logf("upgraded 4 nodes in %s", time.Since(started).Round(time.Second))
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, ns+"-surge")
	}, "the surge node is deleted at the end of the upgrade")

	if charged.most > 1 {
		t.Errorf("%d nodes were out at once under a budget of maxUnavailable 1", charged.most)
	}
	for _, node := range nodes {
		if !charged.seen(node) {
			t.Errorf("the drain of %s was never charged", node)
		}
		at, ok := u.firstEviction[node]
		if !ok {
			t.Errorf("no pod of %s was evicted", node)
			continue
		}
		states := statesAt(emu, node, at)
		if len(states) == 0 || slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=Down") }) {
			t.Errorf("when %s's first eviction was sent its entries were %v, want every one Down", node, states)
		}
	}
	if _, ok := deploymentOf(t, ns, "solo").Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; !ok {
		t.Error("the single-replica Deployment under minAvailable: 1 was not surged")
	}
	waitForBudgetAllowed(t, ns, 1)
}

// statesAt replays the emulator's pool writes up to at: the node's entries'
// admin states then, by "lb/pool".
func statesAt(emu *armemulator.Server, node string, at time.Time) []string {
	last := map[string]armemulator.PoolWrite{}
	for _, w := range emu.History() {
		if w.Pool != "aksOutboundBackendPool" && !w.Time.After(at) {
			last[w.LoadBalancer+"/"+w.Pool] = w
		}
	}
	var states []string
	for _, key := range slices.Sorted(maps.Keys(last)) {
		for _, e := range last[key].Entries {
			if e.Name == node {
				states = append(states, key+"="+e.AdminState)
			}
		}
	}
	return states
}
