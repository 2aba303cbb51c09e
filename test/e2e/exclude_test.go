package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// entriesOf returns the node's entries in the IP-based pools, as
// "lb/pool=state".
func entriesOf(emu *armemulator.Server, node string) []string {
	var out []string
	states := emu.AdminStates()
	for _, p := range coexistPools {
		if s, ok := states[p[0]+"/"+p[1]+"/"+node]; ok {
			out = append(out, p[0]+"/"+p[1]+"="+s)
		}
	}
	return out
}

// setExcluded puts the label Karpenter sets on a node it drains, or takes it
// off.
func setExcluded(t *testing.T, name string, excluded bool) {
	t.Helper()
	var node corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &node); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(node.DeepCopy())
	if excluded {
		node.Labels[corev1.LabelNodeExcludeBalancers] = "karpenter"
	} else {
		delete(node.Labels, corev1.LabelNodeExcludeBalancers)
	}
	if err := env.Client.Patch(context.Background(), &node, patch); err != nil {
		t.Fatal(err)
	}
}

// nodeguardWritesSince lists nodeguard's pool writes after t.
func nodeguardWritesSince(emu *armemulator.Server, since time.Time) []string {
	var out []string
	for _, w := range emu.History() {
		if armemulator.ByNodeguard(w) && w.Time.After(since) {
			out = append(out, fmt.Sprintf("%s/%s at %s", w.LoadBalancer, w.Pool, w.Time.Format(time.RFC3339Nano)))
		}
	}
	return out
}

// recordedEntry lists the admin-state records that hold the entry, as
// "pool (restored)" or "pool (Down)".
func recordedEntry(ctx context.Context, entry string) ([]string, error) {
	var list coordinationv1.LeaseList
	if err := env.Client.List(ctx, &list, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace),
		client.MatchingLabels{"nodeguard.io/record": "load-balancer-admin-state"}); err != nil {
		return nil, err
	}
	var out []string
	for _, l := range list.Items {
		var rec map[string]struct {
			RestoredAt string `json:"restoredAt"`
		}
		if err := json.Unmarshal([]byte(l.Annotations["nodeguard.io/entries-set-down"]), &rec); err != nil {
			continue
		}
		if o, ok := rec[entry]; ok {
			state := "Down"
			if o.RestoredAt != "" {
				state = "restored"
			}
			out = append(out, fmt.Sprintf("%s (%s)", l.Annotations["nodeguard.io/backend-pool"], state))
		}
	}
	return out, nil
}

// TestEntriesRemovedByCloudProviderAreCut: Karpenter labels the nodes it
// drains node.kubernetes.io/exclude-from-external-load-balancers, and
// cloud-provider-azure (the emulator's actor, reconciling every second) then
// removes their entries from the pools, a second writer of membership.
//
//   - A node being deleted, cut and held in its drain, gets the label: its
//     entries go, and it is released once its pod goes, with no
//     LoadBalancerAdminStateUpdateFailed (nor Retrying) event.
//   - A node labelled before its deletion (entries gone before the cut)
//     counts as cut and is released the same way.
//   - A node drained with kubectl drain (its entries Down), then labelled
//     (entries gone), then uncordoned: nothing is restored, nodeguard writes
//     no pool after the uncordon, and when the label goes and
//     cloud-provider-azure adds the entries back, they stay None as it wrote
//     them, still without a write of nodeguard's.
//   - A node drained and uncordoned (its entries restored to None and held
//     so, --azure-admin-state-restore-hold) gets the label: its entries go,
//     and they leave the record at the next verification, long before the
//     hold's end: when they come back they are new, not held.
//
// No write of nodeguard's ever changes a pool's membership.
func TestEntriesRemovedByCloudProviderAreCut(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	name := freshName("exclude")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	var seed []armemulator.Node
	var nodes []string
	for i := range 5 {
		n := fmt.Sprintf("%s-%d", name, i)
		ip := fmt.Sprintf("10.%d.77.%d", len(name), i+4)
		harness.MustCreate(t, env.Client, builder.Node(n, builder.WithLabels("pool", name), builder.WithProviderID(vmssProviderID(i)), builder.WithInternalIP(ip)))
		seed = append(seed, armemulator.Node{Name: n, IPs: []string{ip}, ProviderID: vmssProviderID(i)})
		nodes = append(nodes, n)
	}
	// cutAfter is cut, then excluded; excludedFirst is excluded, then
	// deleted; drained is drained, excluded and uncordoned.
	cutAfter, excludedFirst, drained, restored := nodes[0], nodes[1], nodes[2], nodes[3]
	pod := func(podName, node string, annotations map[string]string) {
		harness.MustCreate(t, env.Client, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: podName, Annotations: annotations},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "example.com/app"}}},
		})
	}
	pod("hold", cutAfter, map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"})
	pod("app", drained, nil)
	pod("app-restored", restored, nil)
	harness.MustCreate(t, env.Client, builder.NDB(name, builder.NDBSelecting("pool", name), builder.NDBMaxUnavailable("3")))

	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, seed, armemulator.Topology{Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	startNodeguard(t, env.Kubeconfig, emu)
	for _, n := range nodes {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	cp := startCloudProvider(t, emu, name, false) // leaves out the nodes labelled to be excluded
	t.Cleanup(func() { _, _ = harness.Kubectl(env.Kubeconfig, "", "uncordon", drained, restored) })

	gone := func(node string) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) { return len(entriesOf(emu, node)) == 0, nil }
	}
	allAre := func(node, state string) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			es := entriesOf(emu, node)
			return len(es) == len(coexistPools) && !slices.ContainsFunc(es, func(s string) bool { return !strings.HasSuffix(s, "="+state) }), nil
		}
	}
	noFailure := func(node string) {
		t.Helper()
		for _, reason := range []string{"LoadBalancerAdminStateUpdateFailed", "LoadBalancerAdminStateUpdateRetrying", "LoadBalancerAdminStateNoBackendPool"} {
			if notes := eventNotes(ctx, t, node, reason); len(notes) > 0 {
				t.Errorf("%s: %s events %q", node, reason, notes)
			}
		}
	}

	// Removed after the cut.
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", "--wait=false", cutAfter)
	harness.Eventually(t, time.Minute, allAre(cutAfter, "Down"), "%s is Down in both pools", cutAfter)
	setExcluded(t, cutAfter, true)
	harness.Eventually(t, 30*time.Second, gone(cutAfter), "cloud-provider-azure removes the entries of %s", cutAfter)
	// Its drain waits for the do-not-evict pod: the termination controller's
	// next passes say how the cut now stands.
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: cutAfter}, &n); err != nil {
			return false, err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == ngv1alpha1.TrafficCutCondition {
				return c.Status == corev1.ConditionTrue && strings.Contains(c.Message, "left backend pool"), nil
			}
		}
		return false, nil
	}, "the TrafficCut condition of %s says its entries left their pools", cutAfter)

	// Removed before the cut.
	setExcluded(t, excludedFirst, true)
	harness.Eventually(t, 30*time.Second, gone(excludedFirst), "cloud-provider-azure removes the entries of %s", excludedFirst)
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", "--wait=false", excludedFirst)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, excludedFirst) },
		"%s, excluded before its deletion, is released", excludedFirst)

	if err := env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "hold"}}); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, cutAfter) },
		"%s, excluded after its cut, is released", cutAfter)
	noFailure(cutAfter)
	noFailure(excludedFirst)

	// Drained, excluded, uncordoned.
	if out, err := kubectlDrain(env.Kubeconfig, drained, 2*time.Minute); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", drained, err, out)
	}
	harness.Eventually(t, 30*time.Second, allAre(drained, "Down"), "the drained %s is Down in both pools", drained)
	setExcluded(t, drained, true)
	harness.Eventually(t, 30*time.Second, gone(drained), "cloud-provider-azure removes the entries of %s", drained)
	uncordoned := time.Now()
	harness.MustKubectl(t, env.Kubeconfig, "", "uncordon", drained)
	harness.WaitForEvent(t, env.Client, drained, "DrainEnded")
	time.Sleep(10 * time.Second) // retries and verifications would have run
	if w := nodeguardWritesSince(emu, uncordoned); len(w) > 0 {
		t.Errorf("nodeguard wrote pools after %s was uncordoned with its entries gone: %v", drained, w)
	}
	if es := entriesOf(emu, drained); len(es) > 0 {
		t.Errorf("entries of %s after the uncordon: %v, want none (nodeguard must not add them back)", drained, es)
	}
	noFailure(drained)

	// The label goes: the entries come back as new ones, None.
	setExcluded(t, drained, false)
	harness.Eventually(t, 30*time.Second, allAre(drained, "None"), "cloud-provider-azure adds the entries of %s back", drained)
	time.Sleep(5 * time.Second)
	if w := nodeguardWritesSince(emu, uncordoned); len(w) > 0 {
		t.Errorf("nodeguard wrote pools after %s was uncordoned with its entries gone: %v", drained, w)
	}
	if ok, _ := allAre(drained, "None")(ctx); !ok {
		t.Errorf("entries of %s = %v, want None as cloud-provider-azure added them", drained, entriesOf(emu, drained))
	}
	noFailure(drained)

	// Restored, then excluded: the held entries leave the record.
	if out, err := kubectlDrain(env.Kubeconfig, restored, 2*time.Minute); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", restored, err, out)
	}
	harness.Eventually(t, 30*time.Second, allAre(restored, "Down"), "the drained %s is Down in both pools", restored)
	harness.MustKubectl(t, env.Kubeconfig, "", "uncordon", restored)
	harness.Eventually(t, 30*time.Second, allAre(restored, "None"), "%s is restored to None", restored)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		rec, err := recordedEntry(ctx, restored)
		return len(rec) == len(coexistPools) && !slices.ContainsFunc(rec, func(s string) bool { return !strings.HasSuffix(s, "(restored)") }), err
	}, "the restored entries of %s are held in the record", restored)
	excluded := time.Now()
	setExcluded(t, restored, true)
	harness.Eventually(t, 30*time.Second, gone(restored), "cloud-provider-azure removes the entries of %s", restored)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		rec, err := recordedEntry(ctx, restored)
		return len(rec) == 0, err
	}, "the restored entries of %s that left their pools leave the record (the hold would keep them 3m)", restored)
	t.Logf("held entries dropped from the record %s after the label", time.Since(excluded).Round(time.Millisecond))
	setExcluded(t, restored, false)
	harness.Eventually(t, 30*time.Second, allAre(restored, "None"), "cloud-provider-azure adds the entries of %s back", restored)
	if w := nodeguardWritesSince(emu, excluded); len(w) > 0 {
		t.Errorf("nodeguard wrote pools after %s's restored entries left: %v", restored, w)
	}
	noFailure(restored)

	if err := armemulator.OnlyAdminStateChanged(emu.History(), armemulator.ByNodeguard); err != nil {
		t.Errorf("a nodeguard write changed membership: %v", err)
	}
	cp.mu.Lock()
	t.Logf("actor %+v; errors %q", cp.actor.Stats(), cp.errs)
	cp.mu.Unlock()
}
