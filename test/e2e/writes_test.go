package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// nodeWritesPerDeletion is what nodeguard writes to a deleted node itself
// (its status and events apart): the cordon and the finalizer's removal.
const nodeWritesPerDeletion = 2

// writesPerDeletion bounds nodeguard's writes of nodes, node status and
// events per deleted node (the fleet issue's bound).
const writesPerDeletion = 6

// TestDeletedNodesAreWrittenTwice deletes three nodes at once, each carrying
// a PDB-protected Deployment's pods and a tolerate-all DaemonSet pod, with
// Azure on and the kubelets' heartbeats going. Every write of a node wakes
// every watcher of nodes in the cluster: nodeguard writes each deleted node
// exactly twice, the cordon and the finalizer's removal, never marks one for
// cluster-autoscaler, and writes at most 6 nodes, node statuses and events in
// all per deleted node: a status change only when a wait lasts, no condition
// written twice, events saying the admission, the budget's charge and the
// release.
func TestDeletedNodesAreWrittenTwice(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ns := freshName("writes")
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	pool := &azurePool{pool: ns}
	node := func(name string, i int) *corev1.Node { return pool.node(name, 60+i, fmt.Sprintf("10.61.0.%d", i+4)) }
	var targets []string
	for i := range 3 {
		targets = append(targets, fmt.Sprintf("%s-%d", ns, i))
		harness.MustCreate(t, env.Client, node(targets[i], i))
	}
	onPool := builder.OnNodes("pool", ns)
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 6, onPool))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MaxUnavailable("1")))
	harness.MustCreate(t, env.Client, allTolerating(ns, "proxy", ns))
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		ready := 0
		for _, target := range targets {
			pods, err := evictablePodsOn(ctx, ns, target)
			if err != nil {
				return false, err
			}
			for i := range pods {
				if harness.PodReady(&pods[i]) {
					ready++
				}
			}
		}
		return ready == 6+3, nil
	}, "web's 6 pods and a proxy pod on each target run")
	for i := range 2 {
		harness.MustCreate(t, env.Client, node(fmt.Sprintf("%s-spare-%d", ns, i), 3+i))
	}
	harness.MustCreate(t, env.Client, builder.NDB(ns, builder.NDBSelecting("pool", ns), builder.NDBMaxUnavailable("3")))
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, pool.vms, armemulator.Topology{Internal: true}),
		armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emu.Close() })
	proxy := startAPIProxy(t)
	startNodeguard(t, proxy.Kubeconfig, emu)
	for _, target := range targets {
		harness.WaitForTerminationFinalizer(t, env.Client, target)
	}
	// Through the proxy, so that each node's DELETE is recorded: what comes
	// after it is written because of the deletion. Events are counted from
	// before the first: the admission's may be written before its answer.
	before := len(proxy.Writes("", ""))
	harness.MustKubectl(t, proxy.Kubeconfig, "", append([]string{"delete", "node", "--wait=false"}, targets...)...)
	harness.Eventually(t, 3*time.Minute, func(ctx context.Context) (bool, error) {
		for _, target := range targets {
			if gone, err := harness.NodeGone(ctx, env.Client, target); !gone || err != nil {
				return false, err
			}
		}
		return true, nil
	}, "the three nodes are released")
	for _, target := range targets {
		harness.WaitForEvent(t, env.Client, target, finalizer.ReasonReleased) // written after the release
	}

	writes := proxy.Writes("", "")
	var statusWrites, eventWrites, refused int
	for _, target := range targets {
		deleted := slices.IndexFunc(writes, func(w harness.Write) bool {
			return w.Method == http.MethodDelete && w.Path == "/api/v1/nodes/"+target
		})
		if deleted < 0 {
			t.Fatalf("the proxy recorded no DELETE of node %s", target)
		}
		var nodeWrites []string
		var statusBodies [][]byte
		for _, w := range writes[deleted+1:] {
			switch {
			case w.Path == "/api/v1/nodes/"+target && w.Status >= http.StatusBadRequest:
				refused++ // a patch whose test failed: no write
			case w.Path == "/api/v1/nodes/"+target:
				nodeWrites = append(nodeWrites, w.Method)
			case w.Path == "/api/v1/nodes/"+target+"/status" && w.Status < http.StatusBadRequest:
				statusWrites++
				statusBodies = append(statusBodies, w.Body)
			}
		}
		if len(nodeWrites) != nodeWritesPerDeletion {
			t.Errorf("node %s written %d times (%v), want %d: the cordon and the finalizer's removal", target, len(nodeWrites), nodeWrites, nodeWritesPerDeletion)
		}
		if repeats := conditionRepeats(t, statusBodies); len(repeats) > 0 {
			t.Errorf("node %s: status writes sent conditions again as the node's previous write had them: %v", target, repeats)
		}
	}
	for _, w := range writes[before:] {
		if strings.Contains(w.Path, "/events") && w.Status < http.StatusBadRequest {
			eventWrites++
		}
	}
	n := float64(len(targets))
	t.Logf("per deleted node: %d node writes (%.1f more refused), %.1f node-status writes, %.1f event writes", nodeWritesPerDeletion,
		float64(refused)/n, float64(statusWrites)/n, float64(eventWrites)/n)
	if all := nodeWritesPerDeletion + float64(statusWrites+eventWrites)/n; all > writesPerDeletion {
		t.Errorf("%.1f writes of nodes, node statuses and events per deleted node, want at most %d", all, writesPerDeletion)
	}
}

// conditionRepeats reads a node's status writes (strategic merge patches of
// its conditions) in order and lists each condition a write set, or removed,
// exactly as the node's previous write of that type had: a write that changes
// nothing, as a pass reading a stale copy of the node would make.
func conditionRepeats(t *testing.T, bodies [][]byte) []string {
	t.Helper()
	last := map[string]string{} // by type: status/reason/message, or "removed"
	var repeats []string
	for i, body := range bodies {
		conditions, err := harness.PatchedConditions(body)
		if err != nil {
			t.Fatalf("status write %d is not a JSON patch: %v\n%s", i, err, body)
		}
		for _, c := range conditions {
			value := c.Status + "/" + c.Reason + "/" + c.Message
			if c.Patch == "delete" {
				value = "removed"
			}
			if last[c.Type] == value {
				repeats = append(repeats, fmt.Sprintf("write %d: %s %s", i, c.Type, value))
			}
			last[c.Type] = value
		}
	}
	return repeats
}
