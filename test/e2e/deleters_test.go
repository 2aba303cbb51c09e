package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	emulator *armemulator.Server
}

func newFleet(t *testing.T, name string, size int) *fleet {
	t.Helper()
	f := &fleet{pool: freshName(name)}
	var emuNodes []armemulator.Node
	for i := range size {
		node := fmt.Sprintf("%s-%d", f.pool, i)
		ip := fmt.Sprintf("10.%d.1.%d", len(f.pool), i+4)
		f.nodes = append(f.nodes, node)
		emuNodes = append(emuNodes, armemulator.Node{Name: node, IPs: []string{ip}, ProviderID: vmssProviderID(i)})
		harness.MustCreate(t, env.Client, builder.Node(node, builder.WithLabels("pool", f.pool),
			builder.WithProviderID(vmssProviderID(i)), builder.WithInternalIP(ip)))
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

// states returns the node's load-balancer entries' admin states, by
// "lb/pool" (the outbound-only pool carries none).
func (f *fleet) states(node string) map[string]string {
	index := strings.TrimPrefix(node, f.pool+"-")
	out := map[string]string{}
	for _, p := range f.emulator.State() {
		if p.Pool == "aksOutboundBackendPool" {
			continue
		}
		for _, e := range p.Entries {
			if e.Name == node || e.IP == "" && strings.Contains(e.IPConfigID, "/virtualMachines/"+index+"/") {
				out[p.LoadBalancer+"/"+p.Pool] = e.AdminState
			}
		}
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

func patchTaints(t *testing.T, node string, change func([]corev1.Taint) []corev1.Taint) {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	n.Spec.Taints = change(n.Spec.Taints)
	if err := env.Client.Patch(context.Background(), &n, patch); err != nil {
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
