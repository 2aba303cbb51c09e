package finalizer

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	azureconfig "github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// These tests run the termination phases with the real admin-state manager,
// talking through the Azure SDK to the ARM emulator.

const (
	azureSub = "00000000-0000-0000-0000-0000000000f1"
	azureRG  = "mc_finalizer_westeurope"
	// azureWait bounds every wait for the admin-state manager.
	azureWait = 20 * time.Second
)

// azureNode is a node in the API server and in the emulated pools.
type azureNode struct {
	name, ip, providerID string
}

func newAzureNode(f *fixture, i int) azureNode {
	name := fmt.Sprintf("%s-node-%d", f.ns, i)
	return azureNode{name: name, ip: fmt.Sprintf("10.240.%d.%d", len(f.ns), 10+i),
		providerID: fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/aks-vmss/virtualMachines/%d", azureSub, azureRG, i)}
}

// withAzure starts the emulator, serving an AKS-like resource group for
// nodes, and an admin-state manager talking to it, used by the fixture for
// the traffic cut and VM checks; resync is the manager's resync interval.
func (f *fixture) withAzure(t *testing.T, topology armemulator.Topology, resync time.Duration, nodes ...azureNode) *armemulator.Server {
	t.Helper()
	return f.withAzureOptions(t, topology, resync, nil, nodes...)
}

// withAzureOptions is withAzure with configure changing the manager's
// options (nil: none).
func (f *fixture) withAzureOptions(t *testing.T, topology armemulator.Topology, resync time.Duration, configure func(*azure.Options), nodes ...azureNode) *armemulator.Server {
	t.Helper()
	var seed []armemulator.Node
	for _, n := range nodes {
		seed = append(seed, armemulator.Node{Name: n.name, IPs: []string{n.ip}, ProviderID: n.providerID})
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(azureSub, azureRG, seed, topology), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	o := azure.NewOptions()
	o.ConfigFile, o.ARMEndpoint, o.SubscriptionID, o.ResourceGroup = "", emu.URL(), azureSub, azureRG
	o.Credential = azureconfig.CredentialNone
	o.Getenv = func(string) string { return "" }
	o.RetryInterval, o.ResyncInterval = 100*time.Millisecond, resync
	o.MaxRetries.V = ptr.To(0)
	if configure != nil {
		configure(&o)
	}
	m, err := azure.NewManager(o, f.events,
		azure.WithSDKRetry(policy.RetryOptions{MaxRetries: -1, TryTimeout: 10 * time.Second}), azure.WithPollFrequency(5*time.Millisecond))
	if err != nil || m == nil {
		t.Fatalf("azure.NewManager = %v, %v", m, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f.r.AdminState, f.r.Instances = m, m
	return emu
}

// node creates the node with the termination finalizer, Ready.
func (f *fixture) azureNode(t *testing.T, n azureNode, opts ...builder.NodeOption) {
	t.Helper()
	f.node(t, n.name, append([]builder.NodeOption{builder.WithProviderID(n.providerID), builder.WithInternalIP(n.ip), builder.Ready()}, opts...)...)
}

// passUntil runs passes of the node until cond holds.
func (f *fixture) passUntil(t *testing.T, node string, cond func() bool, msg string) {
	t.Helper()
	harness.Eventually(t, azureWait, func(context.Context) (bool, error) {
		f.pass(t, node)
		return cond(), nil
	}, "%s", msg)
}

// entryStates are the node's backend entries' admin states, by "lb/pool".
func entryStates(emu *armemulator.Server, node string) map[string]string {
	out := map[string]string{}
	for k, v := range emu.AdminStates() {
		parts := strings.Split(k, "/")
		if parts[1] != "aksOutboundBackendPool" && strings.HasSuffix(parts[2], node) {
			out[parts[0]+"/"+parts[1]] = v
		}
	}
	return out
}

// A traffic cut that failed for good (a 403 on every pool write) is said
// on the node: the TrafficCut condition False with the error, a
// TrafficCutFailed Warning event and nodeguard_traffic_cuts_total{failed}.
// With --traffic-cut-failure=drain the drain then goes on; with wait it
// waits until Azure confirms Down (here: the fault gone, the next resync).
func TestTrafficCutFailureIsReported(t *testing.T) {
	for _, policy := range []TrafficCutFailurePolicy{TrafficCutFailureDrain, TrafficCutFailureWait} {
		t.Run(string(policy), func(t *testing.T) {
			f := newFixture(t, "cut-failed-"+string(policy))
			f.r.Opts.AdminStateTimeout, f.r.Opts.TrafficCutFailure = time.Minute, policy
			n := newAzureNode(f, 0)
			emu := f.withAzure(t, armemulator.Topology{}, time.Second, n)
			removeFault := emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: "/backendAddressPools/", Status: http.StatusForbidden})
			f.azureNode(t, n)
			f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
			failedBefore := testutil.ToFloat64(trafficCuts.WithLabelValues(cutFailed))
			f.deleteNode(t, n.name)

			f.passUntil(t, n.name, func() bool { return len(f.events.with(ReasonTrafficCutFailed)) > 0 }, "a TrafficCutFailed event")
			c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != conditionFailed || !strings.Contains(c.Message, "AuthorizationFailed") {
				t.Errorf("condition %s = %+v, want False, %s, naming the ARM error", ngv1alpha1.TrafficCutCondition, c, conditionFailed)
			}
			if ev := f.events.with(ReasonTrafficCutFailed); !strings.Contains(ev[0], "traffic NOT cut") || !strings.Contains(ev[0], "403") {
				t.Errorf("event %q does not say that traffic was not cut and why", ev[0])
			}
			if got := testutil.ToFloat64(trafficCuts.WithLabelValues(cutFailed)) - failedBefore; got != 1 {
				t.Errorf("nodeguard_traffic_cuts_total{result=failed} grew by %v, want 1", got)
			}
			if policy == TrafficCutFailureDrain {
				f.passUntil(t, n.name, func() bool { return f.podState(t, "web") != "running" }, "the drain goes on")
				return
			}
			for range 3 {
				f.pass(t, n.name)
			}
			if got := f.podState(t, "web"); got != "running" {
				t.Fatalf("pod web is %s while traffic is not cut under --traffic-cut-failure=wait", got)
			}
			removeFault()
			f.passUntil(t, n.name, func() bool { return f.podState(t, "web") != "running" }, "the drain starts once Azure confirms Down")
			if got := entryStates(emu, n.name); got["kubernetes/kubernetes"] != "Down" {
				t.Errorf("entries %v at the first eviction, want Down", got)
			}
			if c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition); c == nil || c.Status != corev1.ConditionTrue {
				t.Errorf("condition %s = %+v once cut, want True", ngv1alpha1.TrafficCutCondition, c)
			}
		})
	}
}

// TestCutoverPauseHoldsTheFirstEvictionAcrossARestart: the confirmed cut is
// recorded in the TrafficCut condition (True, when it ended), and
// --cutover-pause holds the first eviction that long after it, also for a
// process that starts over in the middle of the pause and knows the cut only
// from the condition.
func TestCutoverPauseHoldsTheFirstEvictionAcrossARestart(t *testing.T) {
	f := newFixture(t, "cutover")
	f.r.Opts.AdminStateTimeout, f.r.Opts.CutoverPause = time.Minute, 30*time.Second
	n := newAzureNode(f, 0)
	emu := f.withAzure(t, armemulator.Topology{}, 0, n)
	f.azureNode(t, n)
	f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
	f.deleteNode(t, n.name)

	f.passUntil(t, n.name, func() bool {
		c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition)
		return c != nil && c.Status == corev1.ConditionTrue && c.Reason == conditionCut
	}, "the confirmed cut is recorded in the TrafficCut condition")
	if got := entryStates(emu, n.name); got["kubernetes/kubernetes"] != "Down" {
		t.Fatalf("entries %v once the cut is recorded, want Down", got)
	}
	cut := f.clock.Now()
	f.clock.SetTime(cut.Add(20 * time.Second))
	f.pass(t, n.name)
	if got := f.podState(t, "web"); got != "running" {
		t.Fatalf("pod web is %s 20s into a 30s cutover pause", got)
	}

	// A new leader knows the cut only from the node.
	f.r.mu.Lock()
	f.r.memory = nil
	f.r.mu.Unlock()
	f.clock.SetTime(cut.Add(28 * time.Second))
	f.pass(t, n.name)
	if got := f.podState(t, "web"); got != "running" {
		t.Fatalf("pod web is %s 28s into a 30s cutover pause, after a restart", got)
	}
	f.clock.SetTime(cut.Add(31 * time.Second))
	f.passUntil(t, n.name, func() bool { return f.podState(t, "web") != "running" }, "the drain starts once the pause is over")
}

// A pool that fails at once (a NIC-based pool listing the node only in its
// backendIPConfigurations: no entry can carry Down) does not start the
// drain while the node's other pools' writes are in flight: the first
// eviction comes after every pool confirmed or failed.
func TestDrainWaitsForEveryPool(t *testing.T) {
	f := newFixture(t, "every-pool")
	f.r.Opts.AdminStateTimeout = time.Minute
	n := newAzureNode(f, 0)
	emu := f.withAzure(t, armemulator.Topology{NICBased: true, MembersOnly: true, Internal: true}, time.Hour, n)
	arrived, release := make(chan struct{}), make(chan struct{})
	emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: "/loadBalancers/kubernetes-internal/", Times: 1,
		Before: func() { close(arrived); <-release }})
	f.azureNode(t, n)
	f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
	f.deleteNode(t, n.name)

	f.passUntil(t, n.name, func() bool {
		select {
		case <-arrived:
			return len(f.events.with(azure.ReasonNoEntry)) > 0
		default:
			return false
		}
	}, "the NIC-only pool failed and the internal pool's write is in flight")
	for range 3 {
		f.pass(t, n.name)
	}
	if got := f.podState(t, "web"); got != "running" {
		t.Fatalf("pod web is %s while a pool's Down write is in flight (entries %v)", got, entryStates(emu, n.name))
	}
	close(release)
	f.passUntil(t, n.name, func() bool { return f.podState(t, "web") != "running" }, "the drain starts once every pool confirmed or failed")
	if got := entryStates(emu, n.name); got["kubernetes-internal/kubernetes"] != "Down" {
		t.Errorf("entries %v at the first eviction, want the internal pool's Down", got)
	}
	if len(f.events.with(ReasonTrafficCutFailed)) != 1 {
		t.Errorf("TrafficCutFailed events %v, want one for the NIC-only pool", f.events.with(ReasonTrafficCutFailed))
	}
}

// A NotReady node whose providerID names a resource group ARM does not know
// (404 ResourceGroupNotFound) is not taken for a node whose VM is gone: it is
// not released undrained.
func TestWrongResourceGroupIsNotAGoneVM(t *testing.T) {
	f := newFixture(t, "wrong-rg")
	f.r.Opts.AdminStateTimeout = time.Minute
	n := newAzureNode(f, 0)
	f.withAzure(t, armemulator.Topology{}, time.Hour, n)
	n.providerID = strings.Replace(n.providerID, azureRG, "mc_another_group", 1)
	f.node(t, n.name, builder.WithProviderID(n.providerID), builder.WithInternalIP(n.ip), builder.Unreachable())
	f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
	f.deleteNode(t, n.name)

	f.pass(t, n.name)
	if got := f.events.with(ReasonInstanceGone); len(got) > 0 {
		t.Fatalf("released as a gone VM: %v", got)
	}
	node := getNode(t, n.name)
	if drainingTaint(node) == nil {
		t.Errorf("the node is not cordoned for a drain: taints %v", node.Spec.Taints)
	}
}

// A node Azure confirms Down on no backend pool had nothing cut, and says so:
// the TrafficCut condition False (NotInAnyBackendPool), a
// LoadBalancerAdminStateNoBackendPool Warning event and
// nodeguard_traffic_cuts_total{no_backend_pool}; the drain goes on, as there
// is nothing to wait for. When the configuration names a load balancer ARM
// does not know, the event says so and configuration_ready is 0.
func TestNodeInNoBackendPoolIsNotReportedCut(t *testing.T) {
	for _, tc := range []struct {
		name      string
		configure func(*azure.Options)
		seeded    bool
		ready     float64
		says      string
	}{
		{name: "not a member", ready: 1, says: "check --azure-resource-group"},
		{name: "unknown load balancer", seeded: true, ready: 0, says: "load balancer(s) kubernetez (--azure-load-balancers) do not exist",
			configure: func(o *azure.Options) { o.LoadBalancers = "kubernetez" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "no-pool-"+strings.ReplaceAll(tc.name, " ", "-"))
			f.r.Opts.AdminStateTimeout, f.r.Opts.TrafficCutFailure = time.Minute, TrafficCutFailureWait
			n, other := newAzureNode(f, 0), newAzureNode(f, 1)
			seed := []azureNode{other}
			if tc.seeded {
				seed = append(seed, n)
			}
			f.withAzureOptions(t, armemulator.Topology{}, time.Hour, tc.configure, seed...)
			f.azureNode(t, n)
			f.pod(t, "web", n.name, controlledBy("ReplicaSet"))
			before := testutil.ToFloat64(trafficCuts.WithLabelValues(cutNoPool))
			f.deleteNode(t, n.name)

			f.passUntil(t, n.name, func() bool { return f.podState(t, "web") != "running" }, "the drain goes on")
			c := condition(getNode(t, n.name), ngv1alpha1.TrafficCutCondition)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != conditionNoPool || !strings.Contains(c.Message, "no backend pool") {
				t.Errorf("condition %s = %+v, want False, %s", ngv1alpha1.TrafficCutCondition, c, conditionNoPool)
			}
			f.finish(t, "web")
			f.passUntil(t, n.name, func() bool { return len(f.events.with(ReasonReleased)) > 0 }, "the node is released")
			if got := f.events.with(ReasonReleased); strings.Contains(got[0], "traffic cut") {
				t.Errorf("a node in no pool is reported cut: %v", got)
			}
			ev := f.events.with(azure.ReasonNoBackendPool)
			if len(ev) != 1 || !strings.Contains(ev[0], "no traffic to it was cut") || !strings.Contains(ev[0], tc.says) {
				t.Errorf("%s events %q, want one saying nothing was cut and %q", azure.ReasonNoBackendPool, ev, tc.says)
			}
			if got := testutil.ToFloat64(trafficCuts.WithLabelValues(cutNoPool)) - before; got != 1 {
				t.Errorf("nodeguard_traffic_cuts_total{result=no_backend_pool} grew by %v, want 1", got)
			}
			if got := gauge(t, "loadbalancer_adminstate_configuration_ready"); got != tc.ready {
				t.Errorf("loadbalancer_adminstate_configuration_ready = %v, want %v", got, tc.ready)
			}
		})
	}
}

// gauge reads an unlabelled gauge from the metrics registry.
func gauge(t *testing.T, name string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
