package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/plugin"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestPlanPredictsWhatTheDeletionMeets plans the removal of three nodes of a
// pool under a node budget of one at a time, one of them holding a pod
// annotated do-not-evict, then deletes them for real in the plan's order,
// each tried until admitted, as a script following the plan would: the
// budget admits them in the plan's waves, the blocked node's drain waits for
// the pod the plan named, and the node the plan says never goes is refused
// while it waits.
func TestPlanPredictsWhatTheDeletionMeets(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	ns := freshName("plan")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pool := &azurePool{pool: ns}
	var targets []string
	for i := range 3 {
		targets = append(targets, fmt.Sprintf("%s-%d", ns, i))
		harness.MustCreate(t, env.Client, pool.node(targets[i], 70+i, fmt.Sprintf("10.71.0.%d", i+4)))
	}
	for i := range 2 {
		harness.MustCreate(t, env.Client, pool.node(fmt.Sprintf("%s-spare-%d", ns, i), 73+i, fmt.Sprintf("10.71.0.%d", i+8)))
	}
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 6, builder.OnNodes("pool", ns)))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MaxUnavailable("1")))
	blocked := targets[1]
	harness.MustCreate(t, env.Client, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "precious", Annotations: map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}},
		Spec:       corev1.PodSpec{NodeName: blocked, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	})
	waitForRunning(t, ns, "web", 6, 2*time.Minute)
	harness.MustCreate(t, env.Client, builder.NDB(ns, builder.NDBSelecting("pool", ns), builder.NDBMaxUnavailable("1")))
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, pool.vms, armemulator.Topology{Internal: true}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	startNodeguard(t, env.Kubeconfig, emu)
	for _, target := range targets {
		harness.WaitForTerminationFinalizer(t, env.Client, target)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, &ndb)
		return err == nil && ndb.Status.ExpectedNodes == 5 && ndb.Status.DisruptionsAllowed == 1, err
	}, "the budget counts the pool's 5 nodes and allows 1")

	settings, from := plugin.ReadSettings(ctx, env.Client, "nodeguard-system") // nodeguard runs as a process here: its defaults
	c := &plugin.Cluster{Client: env.Client, Settings: settings, Now: time.Now}
	plan, err := c.Plan(ctx, targets, plugin.PlanOptions{PodCycle: time.Second, MaxConcurrentDrains: plugin.DefaultMaxConcurrentDrains}, from)
	if err != nil {
		t.Fatal(err)
	}
	wave := map[string]plugin.PlannedNode{}
	for _, n := range plan.Nodes {
		wave[n.Node] = n
	}
	t.Logf("plan: %s", plan.Summary)
	if w := wave[blocked]; w.Wave != 2 || !strings.Contains(w.Blocked, "do-not-evict") || !slices.Contains(w.Lost, ns+"/precious") {
		t.Fatalf("the plan of %s = %+v; want wave 2, its drain blocked by the do-not-evict pod %s/precious, which it loses", blocked, w, ns)
	}
	if wave[targets[0]].Wave != 1 || wave[targets[2]].Wave != 0 {
		t.Fatalf("the plan = %s wave %d, %s wave %d; want 1, and never (the blocked node keeps the budget's disruption)",
			targets[0], wave[targets[0]].Wave, targets[2], wave[targets[2]].Wave)
	}

	// The real deletion, as a script following the plan runs it: the nodes in
	// the plan's order, each tried again and again until the budget admits
	// it, the next only then. (In another order the waves hold as well, but
	// which node fills a wave is whoever asks first.)
	admitted := map[string]time.Time{}
	warnings := map[string]string{}
	var inOrder []string
	for _, n := range plan.Nodes {
		inOrder = append(inOrder, n.Node)
	}
	attempt := func() {
		for _, target := range inOrder {
			if _, done := admitted[target]; done {
				continue
			}
			out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", target, "--wait=false")
			switch {
			case err == nil:
				admitted[target], warnings[target] = time.Now(), out
			case strings.Contains(out, "allows no more disruptions"):
				return // its turn has not come
			default:
				t.Fatalf("delete of %s refused for another reason than the budget: %v\n%s", target, err, out)
			}
		}
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		attempt()
		if _, ok := admitted[blocked]; !ok {
			return false, nil
		}
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: blocked}, &n); err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == ngv1alpha1.TerminatingCondition && strings.Contains(cond.Message, "do-not-evict") {
				return true, nil
			}
		}
		return false, nil
	}, "%s is admitted and its drain waits for its do-not-evict pod", blocked)
	// The last node is tried for a while longer: the plan says never.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		attempt()
	}
	var order []string
	for _, target := range targets {
		if _, ok := admitted[target]; ok {
			order = append(order, target)
		}
	}
	slices.SortFunc(order, func(a, b string) int { return admitted[a].Compare(admitted[b]) })
	var planned []string
	for _, n := range plan.Nodes { // in wave order
		if n.Wave > 0 {
			planned = append(planned, n.Node)
		}
	}
	if !slices.Equal(order, planned) {
		t.Errorf("the budget admitted %v, in that order; the plan said %v, and %s never", order, planned, targets[2])
	}
	if want := "Warning: pod " + ns + "/precious annotated nodeguard.io/do-not-evict=true"; !strings.Contains(warnings[blocked], want) {
		t.Errorf("the admitted delete of %s did not warn %q:\n%s", blocked, want, warnings[blocked])
	}

	// Let the blocked node go, so the last one may too.
	if err := env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "precious"}}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, blocked) },
		"%s is released once its do-not-evict pod is gone", blocked)
}
