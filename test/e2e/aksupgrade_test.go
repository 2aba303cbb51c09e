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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/internal/plugin"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	"github.com/nodeguard/nodeguard/upgrade"
)

// managedCluster is the AKS cluster the ARM emulator serves agent pools of.
const managedCluster = "e2e-aks"

func managedClusterID() string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.ContainerService/managedClusters/%s", subscription, resourceGroup, managedCluster)
}

// aksUpgrade plays an AKS node-image upgrade of one agent pool with the
// upgrade settings ARM reports for it, as AKS runs one: maxSurge surge nodes
// first; then batches of maxSurge+maxUnavailable nodes, each batch cordoned at
// once and drained through the Eviction API, 429s retried every second until
// drainTimeoutInMinutes after the cordon; a drained node is reimaged in place
// (NotReady, then Ready with a new boot ID) and uncordoned. A node not drained
// in time is, with undrainableNodeBehavior Cordon, labelled
// kubernetes.azure.com/upgrade-status=Quarantined and left cordoned while the
// upgrade goes on; with Schedule, uncordoned, and the upgrade fails after its
// batch. The surge nodes are deleted at the end (through nodeguard).
type aksUpgrade struct {
	ns, pool string
	settings upgrade.Settings
	reimage  time.Duration

	mu            sync.Mutex
	firstEviction map[string]time.Time
	quarantined   map[string]time.Time
}

// readAgentPool reads the pool's upgrade settings as the upgrade starts, from
// the emulator's agent pool (what ARM says of it).
func readAgentPool(t *testing.T, emu *armemulator.Server, pool string) upgrade.Settings {
	t.Helper()
	p, ok := emu.AgentPool(pool)
	if !ok {
		t.Fatalf("the emulator has no agent pool %s", pool)
	}
	u := p.UpgradeSettings
	return upgrade.Settings{Pool: p.Name, MaxSurge: u.MaxSurge, MaxUnavailable: u.MaxUnavailable,
		DrainTimeout: time.Duration(u.DrainTimeoutInMinutes) * time.Minute, NodeSoak: time.Duration(u.NodeSoakDurationInMinutes) * time.Minute,
		UndrainableNodeBehavior: u.UndrainableNodeBehavior}
}

// run upgrades the nodes and returns when the last batch is done (before the
// surge nodes are deleted, which deleteSurge does); an error names the
// nodes whose drain timed out under Schedule.
func (u *aksUpgrade) run(ctx context.Context, nodes []string) ([]string, error) {
	surge := (upgrade.Settings{MaxSurge: u.settings.MaxSurge}).ConcurrentDrains(len(nodes))
	var surgeNodes []string
	for i := range surge {
		name := fmt.Sprintf("%s-surge-%d", u.pool, i)
		if err := env.Client.Create(ctx, builder.Node(name, builder.WithLabels("pool", u.pool, ngv1alpha1.AgentPoolLabel, u.pool))); err != nil {
			return nil, err
		}
		surgeNodes = append(surgeNodes, name)
	}
	for batch := range slices.Chunk(nodes, u.settings.ConcurrentDrains(len(nodes))) {
		for _, node := range batch {
			if err := setUnschedulable(ctx, node, true); err != nil {
				return nil, err
			}
		}
		deadline := time.Now().Add(u.settings.EffectiveDrainTimeout())
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, node := range batch {
			// AKS starts a batch's drains one after another: the first
			// node's drain is the first charged.
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Second)
				errs[i] = u.upgradeNode(ctx, node, deadline)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return surgeNodes, err
		}
	}
	return surgeNodes, nil
}

// errAKSDrainTimedOut is AKS's failure of a node it could not drain in time.
var errAKSDrainTimedOut = errors.New("drain timed out (Too many Requests)")

func (u *aksUpgrade) upgradeNode(ctx context.Context, node string, deadline time.Time) error {
	err := u.drainBy(ctx, node, deadline)
	switch {
	case errors.Is(err, errAKSDrainTimedOut) && u.settings.Behavior() == upgrade.UndrainableCordon:
		u.mu.Lock()
		u.quarantined[node] = time.Now()
		u.mu.Unlock()
		return labelNode(ctx, node, ngv1alpha1.UpgradeStatusLabel, ngv1alpha1.UpgradeQuarantined)
	case errors.Is(err, errAKSDrainTimedOut):
		if uerr := setUnschedulable(ctx, node, false); uerr != nil {
			return uerr
		}
		return fmt.Errorf("Drain node %s failed when evicting pods: %w", node, err)
	case err != nil:
		return err
	}
	if err := reimageFor(ctx, node, u.reimage); err != nil {
		return err
	}
	return setUnschedulable(ctx, node, false)
}

// drainBy evicts every pod of the node but DaemonSet and mirror pods,
// retrying 429s every second, until none is left or the deadline passes.
func (u *aksUpgrade) drainBy(ctx context.Context, node string, deadline time.Time) error {
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
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return errAKSDrainTimedOut
}

// deleteSurge deletes the surge nodes, retrying 429s for a minute each: the
// last batch's nodes count against the budget until nodeguard sees them back.
func deleteSurge(ctx context.Context, names []string) error {
	for _, name := range names {
		deadline := time.Now().Add(time.Minute)
		for {
			err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			if !apierrors.IsTooManyRequests(err) || time.Now().After(deadline) {
				if client.IgnoreNotFound(err) != nil {
					return err
				}
				break
			}
			time.Sleep(time.Second)
		}
	}
	return nil
}

// reimageFor plays a reimage that takes d: the kubelet stops (NotReady),
// and d later comes back Ready with a new boot ID.
func reimageFor(ctx context.Context, name string, d time.Duration) error {
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
		if ready == corev1.ConditionFalse {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
	}
	return nil
}

func labelNode(ctx context.Context, name, key, value string) error {
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		return err
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Labels[key] = value
	return env.Client.Patch(ctx, &node, patch)
}

// agentPoolNodes makes a pool of n nodes in agent pool (and label pool=)
// pool, each a VM of the scale set, with a Deployment spread one pod a node
// under a PodDisruptionBudget of maxUnavailable 1, a DaemonSet tolerating
// everything, and a NodeDisruptionBudget of maxUnavailable 1 over the pool.
func agentPoolNodes(t *testing.T, ns, pool string, n, firstVM int) ([]string, []armemulator.Node) {
	t.Helper()
	var nodes []string
	var vms []armemulator.Node
	for i := range n {
		name := fmt.Sprintf("%s-%d", pool, i)
		ip := fmt.Sprintf("10.81.%d.%d", firstVM/10, 4+firstVM%10+i)
		nodes = append(nodes, name)
		vms = append(vms, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: vmssProviderID(firstVM + i)})
		harness.MustCreate(t, env.Client, builder.Node(name, builder.WithLabels("pool", pool, ngv1alpha1.AgentPoolLabel, pool),
			builder.WithProviderID(vmssProviderID(firstVM+i)), builder.WithInternalIP(ip)))
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		for _, name := range nodes {
			var node corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil || !nodeReady(&node) || len(node.Spec.Taints) > 0 {
				return false, err
			}
		}
		return true, nil
	}, "every node of agent pool %s is Ready and untainted", pool)
	onPool := builder.OnNodes("pool", pool)
	web := builder.Deployment(ns, pool+"-web", int32(n), onPool)
	spreadOverNodes(web)
	harness.MustCreate(t, env.Client, web)
	harness.MustCreate(t, env.Client, builder.PDB(ns, pool+"-web", builder.MaxUnavailable("1")))
	harness.MustCreate(t, env.Client, allTolerating(ns, pool+"-proxy", pool))
	harness.MustCreate(t, env.Client, builder.NDB(pool, builder.NDBSelecting("pool", pool), builder.NDBMaxUnavailable("1")))
	return nodes, vms
}

// waitForHealthyPDBs waits until every PodDisruptionBudget of the namespace
// counts all its pods healthy.
func waitForHealthyPDBs(t *testing.T, ns string, pdbs int) {
	t.Helper()
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var list policyv1.PodDisruptionBudgetList
		err := env.Client.List(ctx, &list, client.InNamespace(ns))
		healthy := 0
		for _, p := range list.Items {
			if p.Status.CurrentHealthy == p.Status.ExpectedPods && p.Status.ExpectedPods > 0 {
				healthy++
			}
		}
		return healthy == pdbs, err
	}, "every pod of namespace %s runs", ns)
}

// upgradeCondition waits for the budget's UpgradeSettingsFit condition to be
// status, and returns it.
func upgradeCondition(t *testing.T, name string, status metav1.ConditionStatus) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &ndb); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(ndb.Status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
		if c != nil {
			got = *c
		}
		return c != nil && c.Status == status, nil
	}, "NodeDisruptionBudget %s says UpgradeSettingsFit=%s", name, status)
	return got
}

// planUpgrade plans the pool's upgrade with kubectl nodeguard's code, with
// the actor's reimage time and pod cycle, and nodeguard's blocked-PDB policy.
func planUpgrade(t *testing.T, nodes []string, reimage time.Duration, policy drain.BlockedPDBPolicy) *plugin.PlanReport {
	t.Helper()
	ctx := context.Background()
	settings, from := plugin.ReadSettings(ctx, env.Client, "nodeguard-system") // nodeguard runs as a process here: its defaults
	settings.BlockedPDBPolicy, from = policy, from+", with --blocked-pdb-policy="+string(policy)
	c := &plugin.Cluster{Client: env.Client, Settings: settings, Now: time.Now}
	plan, err := c.Plan(ctx, nodes, plugin.PlanOptions{Upgrade: true, ReimageTime: reimage, PodCycle: 5 * time.Second,
		MaxConcurrentDrains: plugin.DefaultMaxConcurrentDrains, ControllerQPS: 20}, from)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	_ = plan.Print(&out)
	t.Logf("kubectl nodeguard plan --upgrade:\n%s", out.String())
	return plan
}

// TestAKSUpgradeThatFitsFinishes upgrades an agent pool of 6 under a
// NodeDisruptionBudget of maxUnavailable 1 with AKS's settings from the ARM
// emulator: maxSurge 3 (3 nodes drained at once), drainTimeoutInMinutes 5,
// Cordon. nodeguard reads the settings and says beforehand that they fit
// (UpgradeSettingsFit True: the third node of a batch waits about two node
// times, well within 5 minutes). The upgrade finishes, no node is
// quarantined, the budget is never exceeded (the 2nd and 3rd of a batch wait
// in 429s), every node's entries are Down before its first eviction, the
// only replica of a Deployment under minAvailable: 1 is surged
// (--blocked-pdb-policy=replace) so that its node's drain completes, the
// surge nodes are deleted at the end through nodeguard, and the plan's
// estimate is within 2x of the upgrade's measured time.
func TestAKSUpgradeThatFitsFinishes(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	ns := freshName("aksfit")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	nodes, vms := agentPoolNodes(t, ns, ns, 6, 100)
	seed := armemulator.SeedForNodes(subscription, resourceGroup, vms, armemulator.Topology{})
	seed.ManagedCluster = &armemulator.ManagedClusterSeed{Name: managedCluster, AgentPools: []armemulator.AgentPoolSeed{{
		Name: ns, Count: 6, UpgradeSettings: armemulator.AgentPoolUpgradeSettings{MaxSurge: "3", DrainTimeoutInMinutes: 5, UndrainableNodeBehavior: "Cordon"},
	}}}
	emu, err := armemulator.Start("127.0.0.1:0", seed, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "solo", 1, builder.OnNodes("pool", ns)))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "solo", builder.MinAvailable("1")))
	waitForHealthyPDBs(t, ns, 2)
	const reimage = 10 * time.Second
	startNodeguard(t, env.Kubeconfig, emu, "--aks-managed-cluster="+managedClusterID(), "--upgrade-node-time=20s", "--blocked-pdb-policy=replace")
	charged := watchCharged(t, ns)
	waitForBudgetAllowed(t, ns, 1)

	if c := upgradeCondition(t, ns, metav1.ConditionTrue); !strings.Contains(c.Message, "agent pool "+ns) {
		t.Errorf("UpgradeSettingsFit says %q, want it to name agent pool %s", c.Message, ns)
	}
	plan := planUpgrade(t, nodes, reimage, drain.BlockedPDBReplace)
	for _, n := range plan.Nodes {
		if n.ExceedsDrainTimeout {
			t.Errorf("the plan says %s would wait past the drain timeout (%s) with settings that fit", n.Node, n.Wait)
		}
	}

	u := &aksUpgrade{ns: ns, pool: ns, settings: readAgentPool(t, emu, ns), reimage: reimage,
		firstEviction: map[string]time.Time{}, quarantined: map[string]time.Time{}}
	started := time.Now()
	surge, err := u.run(ctx, nodes)
	took := time.Since(started)
	if err != nil {
		t.Fatalf("the upgrade failed: %v", err)
	}
	if len(u.quarantined) > 0 {
		t.Errorf("nodes quarantined: %v", u.quarantined)
	}
	ratio := float64(plan.Estimate) / float64(took)
	t.Logf("upgraded 6 nodes in %s; the plan estimated %s (ratio %.2f)", took.Round(time.Second), plan.Estimate.Round(time.Second), ratio)
	if ratio < 0.5 || ratio > 2 {
		t.Errorf("the plan estimated %s for an upgrade that took %s: not within 2x", plan.Estimate.Round(time.Second), took.Round(time.Second))
	}
	if err := deleteSurge(ctx, surge); err != nil {
		t.Errorf("deleting the surge nodes: %v", err)
	}
	for _, name := range surge {
		harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, name)
		}, "surge node %s is deleted at the end of the upgrade", name)
	}
	if _, ok := deploymentOf(t, ns, "solo").Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]; !ok {
		t.Error("the single-replica Deployment under minAvailable: 1 was not surged")
	}
	if charged.most > 1 {
		t.Errorf("%d nodes were out at once under a budget of maxUnavailable 1", charged.most)
	}
	for _, node := range nodes {
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
}

// TestAKSUpgradeThatDoesNotFitIsSaidAndGivenUp upgrades two agent pools of 6,
// each under a NodeDisruptionBudget of maxUnavailable 1, with maxSurge 3 and
// drainTimeoutInMinutes 1, one with undrainableNodeBehavior Cordon and one
// with Schedule; each pool's first node runs the only replica of a
// Deployment under minAvailable: 1, whose eviction is refused for good. With
// a node time of 40 s the third node of a batch would wait 80 s: before the
// upgrades start, each budget's UpgradeSettingsFit is False naming the
// settings that fit, and the plan flags the nodes that would wait past the
// drain timeout. The upgrades run: past a minute the blocked first node is
// given up. Cordon: AKS quarantines it, and within 30 s nodeguard gives its
// budget room back and restores its entries to None, and the upgrade goes on
// (the next batch's first node is charged). Schedule: the upgrade fails and
// AKS uncordons the node, which gets its room and traffic back too. Neither
// budget is ever exceeded.
func TestAKSUpgradeThatDoesNotFitIsSaidAndGivenUp(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ns := freshName("aksunfit")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pools := map[string]string{upgrade.UndrainableCordon: ns + "-c", upgrade.UndrainableSchedule: ns + "-s"}
	poolNodes := map[string][]string{}
	var vms []armemulator.Node
	var agentPools []armemulator.AgentPoolSeed
	for i, behavior := range []string{upgrade.UndrainableCordon, upgrade.UndrainableSchedule} {
		pool := pools[behavior]
		nodes, poolVMs := agentPoolNodes(t, ns, pool, 6, 110+10*i)
		poolNodes[pool], vms = nodes, append(vms, poolVMs...)
		agentPools = append(agentPools, armemulator.AgentPoolSeed{Name: pool, Count: 6, UpgradeSettings: armemulator.AgentPoolUpgradeSettings{
			MaxSurge: "3", DrainTimeoutInMinutes: 1, UndrainableNodeBehavior: behavior,
		}})
		solo := builder.Deployment(ns, pool+"-solo", 1, builder.OnNodes(corev1.LabelHostname, nodes[0]))
		harness.MustCreate(t, env.Client, solo)
		harness.MustCreate(t, env.Client, builder.PDB(ns, pool+"-solo", builder.MinAvailable("1")))
	}
	seed := armemulator.SeedForNodes(subscription, resourceGroup, vms, armemulator.Topology{})
	seed.ManagedCluster = &armemulator.ManagedClusterSeed{Name: managedCluster, AgentPools: agentPools}
	emu, err := armemulator.Start("127.0.0.1:0", seed, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	waitForHealthyPDBs(t, ns, 4)
	const nodeTime = 40 * time.Second
	startNodeguard(t, env.Kubeconfig, emu, "--aks-managed-cluster="+managedClusterID(), "--upgrade-node-time="+nodeTime.String())

	watches := map[string]*chargedLog{}
	for _, pool := range pools {
		watches[pool] = watchCharged(t, pool)
		waitForBudgetAllowed(t, pool, 1)
		c := upgradeCondition(t, pool, metav1.ConditionFalse)
		if c.Reason != ngv1alpha1.ReasonSurgeExceedsBudget || !strings.Contains(c.Message, "maxSurge 1 with maxUnavailable 0") {
			t.Errorf("budget %s: UpgradeSettingsFit = %s %q, want %s naming the settings that fit", pool, c.Status, c.Message, ngv1alpha1.ReasonSurgeExceedsBudget)
		}
		plan := planUpgrade(t, poolNodes[pool], nodeTime-5*time.Second, drain.BlockedPDBWait)
		if !slices.ContainsFunc(plan.Nodes, func(n plugin.PlannedNode) bool { return n.ExceedsDrainTimeout }) {
			t.Errorf("the plan of agent pool %s flags no node waiting past its 1 minute drain timeout", pool)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	upgrades := map[string]*aksUpgrade{}
	errs := map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for behavior, pool := range pools {
		u := &aksUpgrade{ns: ns, pool: pool, settings: readAgentPool(t, emu, pool), reimage: nodeTime - 5*time.Second,
			firstEviction: map[string]time.Time{}, quarantined: map[string]time.Time{}}
		upgrades[behavior] = u
		wg.Go(func() {
			_, err := u.run(ctx, poolNodes[pool])
			mu.Lock()
			errs[pool] = err
			mu.Unlock()
		})
	}

	// Cordon: quarantined, then given up within 30 s; the upgrade goes on.
	cordoned := pools[upgrade.UndrainableCordon]
	blocked := poolNodes[cordoned][0]
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		u := upgrades[upgrade.UndrainableCordon]
		u.mu.Lock()
		defer u.mu.Unlock()
		_, ok := u.quarantined[blocked]
		return ok, nil
	}, "AKS quarantines %s, whose drain cannot end", blocked)
	quarantinedAt := upgrades[upgrade.UndrainableCordon].quarantined[blocked]
	if !watches[cordoned].seen(blocked) {
		t.Fatalf("%s was quarantined without its drain ever being charged: nothing to give back", blocked)
	}
	givenBack(t, emu, cordoned, blocked, quarantinedAt)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return watches[cordoned].seen(poolNodes[cordoned][3]), nil
	}, "the upgrade goes on: the next batch's first node, %s, is charged", poolNodes[cordoned][3])

	// Schedule: the upgrade fails, the node is uncordoned and given back.
	scheduled := pools[upgrade.UndrainableSchedule]
	harness.Eventually(t, 2*time.Minute, func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		_, done := errs[scheduled]
		return done, nil
	}, "the upgrade of agent pool %s ends", scheduled)
	if err := errs[scheduled]; !errors.Is(err, errAKSDrainTimedOut) {
		t.Errorf("the upgrade with undrainableNodeBehavior Schedule ended with %v, want its drain timeout", err)
	}
	givenBack(t, emu, scheduled, poolNodes[scheduled][0], time.Now())
	cancel()
	wg.Wait()

	for pool, w := range watches {
		if w.most > 1 {
			t.Errorf("%d nodes of agent pool %s were out at once under a budget of maxUnavailable 1", w.most, pool)
		}
	}
}

// givenBack waits (30 s from since) until the node's drain is no longer
// charged to the budget and its entries are None again.
func givenBack(t *testing.T, emu *armemulator.Server, budgetName, node string, since time.Time) {
	t.Helper()
	harness.Eventually(t, time.Until(since.Add(30*time.Second)), func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		if unavailable, _ := budget.Unavailable(&n, nil); unavailable {
			return false, nil
		}
		var ndb ngv1alpha1.NodeDisruptionBudget
		if err := env.Client.Get(ctx, client.ObjectKey{Name: budgetName}, &ndb); err != nil {
			return false, err
		}
		if _, charged := ndb.Status.DisruptedNodes[node]; charged {
			return false, nil
		}
		states := statesAt(emu, node, time.Now())
		return len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=None") }), nil
	}, "%s's budget room is back and its entries are None", node)
}

// setUnschedulable cordons or uncordons the node, as kubectl does.
func setUnschedulable(ctx context.Context, name string, unschedulable bool) error {
	patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, unschedulable))
	return env.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, patch))
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
