package taintwatch

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nodeguard/nodeguard/azure"
	azureconfig "github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/internal/recorder"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) {
	harness.Main(m, harness.Options{}, &env)
}

const (
	testSub = "00000000-0000-0000-0000-000000000001"
	testRG  = "mc_nodeguard_cluster_westeurope"

	// waitTimeout bounds every wait for the cluster or Azure to converge.
	waitTimeout = 20 * time.Second
)

// testNode is a node in the API server and in the emulated pools.
type testNode struct {
	name, v4, v6, providerID string
}

func vmssNode(name string, i int) testNode {
	return testNode{
		name: name, v4: fmt.Sprintf("10.224.0.%d", 10+i), v6: fmt.Sprintf("fd00::%x", 10+i),
		providerID: fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-vmss/virtualMachines/%d",
			testSub, strings.ToUpper(testRG), i),
	}
}

func vmasNode(name string, i int) testNode {
	return testNode{
		name: name, v4: fmt.Sprintf("10.224.1.%d", 10+i), v6: fmt.Sprintf("fd00::1:%x", 10+i),
		providerID: fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachines/%s", testSub, testRG, name),
	}
}

// startEmulator serves an AKS-like resource group for nodes: a public load
// balancer whose IPv4 pool is NIC-based, an IP-based IPv6 pool, an
// outbound-only pool, and an internal load balancer with IP-based IPv4 and
// IPv6 pools.
func startEmulator(t *testing.T, nodes ...testNode) *armemulator.Server {
	t.Helper()
	var seed []armemulator.Node
	for _, n := range nodes {
		seed = append(seed, armemulator.Node{Name: n.name, IPs: []string{n.v4, n.v6}, ProviderID: n.providerID})
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(testSub, testRG, seed, armemulator.Topology{NICBased: true, Internal: true}), armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	return emu
}

// createNode creates the node in the API server (deleted at cleanup).
func createNode(t *testing.T, n testNode, taints ...corev1.Taint) *corev1.Node {
	t.Helper()
	node := builder.Node(n.name, builder.WithProviderID(n.providerID), builder.WithInternalIP(n.v4), builder.WithInternalIP(n.v6),
		builder.WithTaints(taints...), builder.Ready())
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNode(t, n.name) })
	return node
}

func deleteNode(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	harness.Eventually(t, waitTimeout, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, types.NamespacedName{Name: name}, &corev1.Node{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}, "node %s is gone", name)
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), types.NamespacedName{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

// updateTaints changes a node's taints (retrying on conflicts).
func updateTaints(t *testing.T, name string, change func([]corev1.Taint) []corev1.Taint) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
			return false, err
		}
		n.Spec.Taints = change(n.Spec.Taints)
		err := env.Client.Update(ctx, &n)
		return err == nil, client.IgnoreAlreadyExists(err)
	}, "taints of %s are updated", name)
}

func withTaint(taint corev1.Taint) func([]corev1.Taint) []corev1.Taint {
	return func(ts []corev1.Taint) []corev1.Taint { return append(ts, taint) }
}

func withoutTaint(key string) func([]corev1.Taint) []corev1.Taint {
	return func(ts []corev1.Taint) []corev1.Taint {
		var out []corev1.Taint
		for _, t := range ts {
			if t.Key != key {
				out = append(out, t)
			}
		}
		return out
	}
}

// nodeguardOptions change how startNodeguard builds its admin-state manager.
type nodeguardOptions struct {
	resync     time.Duration
	maxRetries int
	spotEvents bool
	// spotExpiry, managed and clock set the spot tainter's
	// --spot-eviction-notice-expiry (0 here: never), --node-selector (nil:
	// every node) and clock (nil: the real one).
	spotExpiry time.Duration
	managed    labels.Selector
	clock      clock.Clock
	goneGrace  time.Duration
	// signals are the signal taints and who acts on them (zero: the defaults).
	signals azure.Signals
}

// startNodeguard runs a controller-runtime manager with the signal package
// (and, with emu, an admin-state manager talking to it through the real Azure
// SDK client) until the returned stop function or the test's end.
func startNodeguard(t *testing.T, emu *armemulator.Server, o nodeguardOptions) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Several nodeguards run one after another in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	// As cmd/nodeguard does: events queued at the stop are still written.
	mgr, events, err := recorder.ForManager(mgr)
	if err != nil {
		t.Fatal(err)
	}
	var adminState *azure.Manager
	if emu != nil {
		ao := azure.NewOptions()
		ao.ConfigFile = ""
		ao.ARMEndpoint = emu.URL()
		ao.SubscriptionID = testSub
		ao.ResourceGroup = testRG
		ao.Credential = azureconfig.CredentialNone
		ao.Getenv = func(string) string { return "" }
		ao.RetryInterval = 100 * time.Millisecond
		ao.MaxRetries.V = ptr.To(o.maxRetries)
		if o.resync > 0 {
			ao.ResyncInterval = o.resync
		}
		if o.goneGrace > 0 {
			ao.GoneNodeGrace = o.goneGrace
		}
		// As cmd/nodeguard does: records in Leases, nodes from the cache.
		mo := append(azure.InCluster(mgr.GetClient(), mgr.GetAPIReader()),
			azure.WithSDKRetry(policy.RetryOptions{MaxRetries: 2, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond, TryTimeout: 2 * time.Second}),
			azure.WithPollFrequency(5*time.Millisecond))
		adminState, err = azure.NewManager(ao, mgr.GetEventRecorder("nodeguard-admin-state"), mo...)
		if err != nil || adminState == nil {
			t.Fatalf("azure.NewManager = %v, %v", adminState, err)
		}
		if err := mgr.Add(adminState); err != nil {
			t.Fatal(err)
		}
	}
	opts := NewOptions()
	opts.SpotEvents, opts.Signals, opts.SpotNoticeExpiry, opts.Managed, opts.Clock = o.spotEvents, o.signals, o.spotExpiry, o.managed, o.clock
	if err := Setup(mgr, adminState, opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("nodeguard stopped with error: %v", err)
			}
			flushCtx, cancelFlush := context.WithTimeout(context.Background(), waitTimeout)
			defer cancelFlush()
			if err := events.Flush(flushCtx); err != nil {
				t.Errorf("flushing events: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// entries are a node's backend entries ("lb/pool/entry" → admin state),
// except the outbound-only pool, which nodeguard never touches.
func entries(emu *armemulator.Server, node string) map[string]string {
	out := map[string]string{}
	for k, v := range emu.AdminStates() {
		parts := strings.Split(k, "/")
		if parts[1] == "aksOutboundBackendPool" {
			continue
		}
		if parts[2] == node || parts[2] == testRG+"-"+node {
			out[k] = v
		}
	}
	return out
}

// allEntries reports whether every entry of the node (at least want of them)
// is in state.
func allEntries(emu *armemulator.Server, node, state string, want int) error {
	es := entries(emu, node)
	if len(es) < want {
		return fmt.Errorf("node %s has %d backend entries, want %d: %v", node, len(es), want, es)
	}
	for k, v := range es {
		if v != state {
			return fmt.Errorf("entry %s is %s, want %s (all: %v)", k, v, state, es)
		}
	}
	return nil
}

// entriesPerNode: NIC-based public IPv4, public IPv6, internal IPv4 and IPv6.
const entriesPerNode = 4

func waitEntries(t *testing.T, emu *armemulator.Server, node, state string) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		err := allEntries(emu, node, state, entriesPerNode)
		return err == nil, err
	}, "every backend entry of %s is %s", node, state)
}

func wantEntries(t *testing.T, emu *armemulator.Server, node, state string) {
	t.Helper()
	if err := allEntries(emu, node, state, entriesPerNode); err != nil {
		t.Error(err)
	}
}

// puts counts the backend pool writes the emulator served.
func puts(emu *armemulator.Server) int { return emu.Count(http.MethodPut, "/backendAddressPools/") }

// listCalls counts load-balancer listings (one per admin-state discovery,
// resync, or verification while a node is held Down).
func listCalls(emu *armemulator.Server) int {
	n := 0
	for _, r := range emu.Requests() {
		if r.Method == http.MethodGet && strings.HasSuffix(strings.ToLower(r.Path), "/loadbalancers") {
			n++
		}
	}
	return n
}

// waitResyncs waits until the admin-state manager listed the load balancers
// n more times: it has looked at every pool since.
func waitResyncs(t *testing.T, emu *armemulator.Server, n int) {
	t.Helper()
	start := listCalls(emu)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return listCalls(emu) >= start+n, nil
	}, "%d more admin-state resyncs", n)
}

// nodeEvents returns the events about a node object (by UID), by reason,
// counting each occurrence of a series.
func nodeEvents(t *testing.T, node *corev1.Node) (map[string]int, error) {
	t.Helper()
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.MatchingFields{"involvedObject.uid": string(node.UID)}); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range list.Items {
		n := 1
		if e.Series != nil && e.Series.Count > 1 {
			n = int(e.Series.Count)
		}
		if e.Count > int32(n) {
			n = int(e.Count)
		}
		out[e.Reason] += n
	}
	return out, nil
}

func waitEvent(t *testing.T, node *corev1.Node, reason string) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		got, err := nodeEvents(t, node)
		return got[reason] > 0, err
	}, "node %s has a %s event", node.Name, reason)
}

// reconciles is how many reconciles a controller finished.
func reconciles(t *testing.T, controller string) float64 {
	return harness.CounterSum(t, "controller_runtime_reconcile_total", "controller", controller)
}
