package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/test/armemulator"
)

const (
	testSub = "00000000-0000-0000-0000-000000000001"
	testRG  = "mc_nodeguard_cluster_westeurope"

	publicPool   = "/loadBalancers/kubernetes/backendAddressPools/kubernetes"
	internalPool = "/loadBalancers/kubernetes-internal/backendAddressPools/kubernetes"
)

type recordedEvent struct{ node, typ, reason, note string }

// fakeRecorder records events (it implements k8s.io/client-go/tools/events.EventRecorder).
type fakeRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (r *fakeRecorder) Eventf(regarding, _ runtime.Object, typ, reason, _, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Events are about nodes, but for those about record Leases: both by name.
	n := regarding.(metav1.Object)
	r.events = append(r.events, recordedEvent{node: n.GetName(), typ: typ, reason: reason, note: fmt.Sprintf(note, args...)})
}

// reasons lists a node's event reasons in order.
func (r *fakeRecorder) reasons(node string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.node == node {
			out = append(out, e.reason)
		}
	}
	return out
}

func (r *fakeRecorder) all() []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recordedEvent(nil), r.events...)
}

func testNode(name string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

type testEnv struct {
	t     *testing.T
	ctx   context.Context
	emu   *armemulator.Server
	m     *Manager
	clk   *testingclock.FakeClock
	rec   *fakeRecorder
	nodes []*corev1.Node
	// remake builds another manager like m (a restart: same store, same
	// emulator, same clock and recorder).
	remake func() *Manager
}

// envSettings is what envOptions change.
type envSettings struct {
	o       *Options
	emu     *armemulator.Options
	manager []ManagerOption
}

type envOption func(*envSettings)

func withMaxRetries(n int) envOption {
	return func(s *envSettings) { s.o.MaxRetries.V = ptr.To(n) }
}

func withAsync() envOption {
	return func(s *envSettings) { s.emu.Async, s.emu.AsyncPolls = true, 1 }
}

// withManager passes options to NewManager (records, a node reader).
func withManager(mo ...ManagerOption) envOption {
	return func(s *envSettings) { s.manager = append(s.manager, mo...) }
}

// newEnv starts an emulator with a public and an internal load balancer
// holding n IP-based nodes (IPv4, plus IPv6 when dual), and a manager
// talking to it through the real SDK client, on a fake clock.
func newEnv(t *testing.T, n int, dual bool, opts ...envOption) *testEnv {
	t.Helper()
	var nodes []*corev1.Node
	var seedNodes []armemulator.Node
	for i := range n {
		ips := []string{fmt.Sprintf("10.224.%d.%d", i/200, 4+i%200)}
		if dual {
			ips = append(ips, fmt.Sprintf("fd00::%x", 4+i))
		}
		name := fmt.Sprintf("aks-nodepool1-vmss%06d", i)
		nodes = append(nodes, testNode(name, ips...))
		seedNodes = append(seedNodes, armemulator.Node{Name: name, IPs: ips})
	}
	return newEnvWithSeed(t, armemulator.SeedForNodes(testSub, testRG, seedNodes, armemulator.Topology{Internal: true}), nodes, opts...)
}

func newEnvWithSeed(t *testing.T, seed armemulator.Seed, nodes []*corev1.Node, opts ...envOption) *testEnv {
	t.Helper()
	o := NewOptions()
	var eo armemulator.Options
	settings := envSettings{o: &o, emu: &eo}
	for _, opt := range opts {
		opt(&settings)
	}
	emu, err := armemulator.Start("127.0.0.1:0", seed, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	o.ConfigFile = ""
	o.ARMEndpoint = emu.URL()
	o.SubscriptionID = testSub
	o.ResourceGroup = testRG
	o.Credential = config.CredentialNone
	o.Getenv = func(string) string { return "" }
	clk := testingclock.NewFakeClock(time.Now())
	rec := &fakeRecorder{}
	remake := func() *Manager {
		m, err := NewManager(o, rec, append([]ManagerOption{WithClock(clk),
			WithSDKRetry(policy.RetryOptions{MaxRetries: 3, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond, TryTimeout: 2 * time.Second}),
			WithPollFrequency(5 * time.Millisecond)}, settings.manager...)...)
		if err != nil {
			t.Fatal(err)
		}
		if m == nil {
			t.Fatal("NewManager returned no manager for a complete configuration")
		}
		return m
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &testEnv{t: t, ctx: ctx, emu: emu, m: remake(), clk: clk, rec: rec, nodes: nodes, remake: remake}
}

func (e *testEnv) tick() { e.m.tick(e.ctx) }

func (e *testEnv) step(d time.Duration) { e.clk.Step(d) }

// state is an entry's admin state in the emulator.
func (e *testEnv) state(lb, pool, entry string) string {
	return e.emu.AdminStates()[lb+"/"+pool+"/"+entry]
}

// wantStates checks a node's entries in the public and internal IPv4 pools,
// and that the outbound-only pool is never touched.
func (e *testEnv) wantStates(node string, want AdminState) {
	e.t.Helper()
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		if got := e.state(lb, "kubernetes", node); got != string(want) {
			e.t.Errorf("%s/kubernetes/%s admin state = %q, want %q", lb, node, got, want)
		}
	}
	if got := e.state("kubernetes", "aksOutboundBackendPool", node); got != "None" {
		e.t.Errorf("outbound-only pool entry %s = %q, want it untouched (None)", node, got)
	}
}

func (e *testEnv) wantConfirmed(n *corev1.Node, state AdminState) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 50*time.Millisecond)
	defer cancel()
	if err := e.m.WaitConfirmed(ctx, n.UID, state); err != nil {
		e.t.Errorf("WaitConfirmed(%s, %s) = %v, want confirmed", n.Name, state, err)
	}
}

func (e *testEnv) wantReasons(node string, want ...string) {
	e.t.Helper()
	got := e.rec.reasons(node)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		e.t.Errorf("events for %s = %v, want %v", node, got, want)
	}
}

func (e *testEnv) puts(path string) int { return e.emu.Count(http.MethodPut, path) }
func (e *testEnv) gets(path string) int { return e.emu.Count(http.MethodGet, path) }

func failures() float64  { return testutil.ToFloat64(poolUpdates.WithLabelValues(resultFailure)) }
func successes() float64 { return testutil.ToFloat64(poolUpdates.WithLabelValues(resultSuccess)) }

func TestDownThenNone(t *testing.T) {
	e := newEnv(t, 3, false)
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	if got := e.puts(""); got != 0 {
		t.Fatalf("%d PUTs with nothing to change, want 0", got)
	}
	e.wantConfirmed(n0, AdminStateNone)
	if evs := e.rec.all(); len(evs) != 0 {
		t.Fatalf("events with nothing changed: %v", evs)
	}

	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(e.nodes[1].Name, AdminStateNone)
	e.wantConfirmed(n0, AdminStateDown)
	if got := e.puts(""); got != 2 {
		t.Errorf("%d PUTs, want 2 (one per pool holding the node)", got)
	}
	for _, r := range e.emu.Requests() {
		if r.Method == http.MethodPut && !strings.HasPrefix(r.IfMatch, `W/"`) {
			t.Errorf("PUT %s without If-Match ETag (%q)", r.Path, r.IfMatch)
		}
	}
	e.wantReasons(n0.Name, ReasonDown)

	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	e.wantConfirmed(n0, AdminStateNone)
	e.wantReasons(n0.Name, ReasonDown, ReasonNone)
	e.wantReasons(e.nodes[1].Name)
}

func TestHundredNodesFourPoolsOneBatch(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			var opts []envOption
			if async {
				opts = append(opts, withAsync())
			}
			e := newEnv(t, 100, true, opts...)
			for _, n := range e.nodes {
				e.m.SetDesired(n, AdminStateDown)
			}
			e.tick()
			if got := e.puts("/backendAddressPools/"); got > 4 || got == 0 {
				t.Errorf("%d pool PUTs for 100 nodes in 4 pools, want 1..4", got)
			}
			for _, p := range e.emu.State() {
				want := "Down"
				if p.Pool == "aksOutboundBackendPool" {
					want = "None"
				}
				for _, entry := range p.Entries {
					if entry.AdminState != want {
						t.Fatalf("%s/%s/%s = %s, want %s", p.LoadBalancer, p.Pool, entry.Name, entry.AdminState, want)
					}
				}
			}
			for _, n := range e.nodes {
				e.wantConfirmed(n, AdminStateDown)
			}
			if got := len(e.rec.all()); got != 100 {
				t.Errorf("%d events, want one Down event per node (100)", got)
			}
		})
	}
}

// A read's 429 parks the pool it was for; other load balancers proceed.
func TestThrottleParksPool(t *testing.T) {
	e := newEnv(t, 3, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	throttledBefore := testutil.ToFloat64(armclient.Throttled(armclient.OpGetPool))
	e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: publicPool, Status: http.StatusTooManyRequests, RetryAfter: "30", Times: 1})
	failuresBefore := failures()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("internal pool not updated while the public one is throttled: %s", got)
	}
	if got := e.gets(publicPool); got != 1 {
		t.Errorf("%d GETs of the throttled pool, want 1 (the SDK must not retry a throttle)", got)
	}
	if got := testutil.ToFloat64(armclient.Throttled(armclient.OpGetPool)); got != throttledBefore+1 {
		t.Errorf("throttle metric went %v → %v, want +1", throttledBefore, got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	requests := len(e.emu.Requests())

	// Ticks before Retry-After: no call, no event, no retry count, even
	// with newer work for the parked pool; other pools proceed.
	e.step(10 * time.Second)
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	e.step(10 * time.Second)
	e.tick()
	if got := e.gets(publicPool) + e.puts(publicPool); got != 1 {
		t.Errorf("parked pool was called: %d requests", got)
	}
	if got := e.state("kubernetes-internal", "kubernetes", n1.Name); got != "Down" {
		t.Errorf("other pool did not proceed while one is parked: %s", got)
	}
	if got := e.state("kubernetes", "kubernetes", n1.Name); got != "None" {
		t.Errorf("parked pool changed: %s", got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	e.wantReasons(n1.Name)
	if w := e.m.nodes[n0.UID].pools["kubernetes/kubernetes"]; w.retries != 1 {
		t.Errorf("retry count %d while parked, want 1", w.retries)
	}
	if len(e.emu.Requests()) <= requests {
		t.Errorf("no requests for the other pool")
	}

	e.step(11 * time.Second) // past Retry-After
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(n1.Name, AdminStateDown)
	e.wantConfirmed(n0, AdminStateDown)
	e.wantConfirmed(n1, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
	e.wantReasons(n1.Name, ReasonDown)
	if failures() != failuresBefore {
		t.Errorf("failure metric recorded for a throttle that later succeeded")
	}
	if n := e.emu.Status("", "", http.StatusPreconditionFailed); n != 0 {
		t.Errorf("%d answers 412, want 0", n)
	}
}

// A write's 429 is the subscription's write budget: until its Retry-After
// no write reaches ARM, for any load balancer, while reads go on.
func TestWriteThrottleParksEveryWriteOfTheSubscription(t *testing.T) {
	e := newEnv(t, 3, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	throttledBefore := testutil.ToFloat64(armclient.Throttled(armclient.OpUpdatePool))
	// The public pool's PUT is refused once the internal one went through,
	// so that the first round is the same whichever writer runs first.
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusTooManyRequests, RetryAfter: "30", Times: 1,
		Before: func() { waitFor(t, func() bool { return e.puts(internalPool) == 1 }) }})
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Fatalf("internal pool = %s, want Down", got)
	}
	if got := testutil.ToFloat64(armclient.Throttled(armclient.OpUpdatePool)); got != throttledBefore+1 {
		t.Errorf("throttle metric went %v → %v, want +1", throttledBefore, got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)

	e.step(10 * time.Second)
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	if got := e.puts(internalPool); got != 1 {
		t.Errorf("%d PUTs to the internal pool while the subscription's writes are throttled, want 1 (the first)", got)
	}
	if got := e.gets(internalPool); got != 2 {
		t.Errorf("%d GETs of the internal pool, want 2 (reads are not gated by a write's 429)", got)
	}
	if got := e.state("kubernetes-internal", "kubernetes", n1.Name); got != "None" {
		t.Errorf("internal pool written past the write gate: %s", got)
	}
	e.wantReasons(n1.Name, ReasonUpdateRetrying)

	e.step(21 * time.Second) // past Retry-After
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(n1.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
	e.wantReasons(n1.Name, ReasonUpdateRetrying, ReasonDown)
}

// A 429 RetryableError is a load balancer another operation is updating (on
// AKS, cloud-provider-azure reconciling it), not the subscription's write
// budget: that load balancer's pools wait for its Retry-After, every other
// load balancer is written at once.
func TestBusyLoadBalancerParksOnlyItsOwnPools(t *testing.T) {
	e := newEnv(t, 3, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusTooManyRequests, ErrorCode: "RetryableError", RetryAfter: "30", Times: 1,
		Before: func() { waitFor(t, func() bool { return e.puts(internalPool) == 1 }) }})
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Fatalf("internal pool = %s, want Down", got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)

	e.step(10 * time.Second)
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n1.Name); got != "Down" {
		t.Errorf("internal pool = %s while the public load balancer is busy, want Down (not gated)", got)
	}
	if got := e.puts(publicPool); got != 1 {
		t.Errorf("%d PUTs to the busy load balancer before its Retry-After, want 1", got)
	}

	e.step(21 * time.Second) // past Retry-After
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(n1.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
}

func TestThrottleRetryAfterNotInFutureFallsBackToNextTick(t *testing.T) {
	for name, retryAfter := range map[string]string{
		"no Retry-After":        "",
		"Retry-After in past":   time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat),
		"Retry-After unusable":  "soon",
		"Retry-After 0 seconds": "0",
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 2, false)
			n0 := e.nodes[0]
			e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: publicPool, Status: http.StatusTooManyRequests, RetryAfter: retryAfter, Times: 1})
			e.m.SetDesired(n0, AdminStateDown)
			e.tick()
			e.wantReasons(n0.Name, ReasonUpdateRetrying)
			e.step(e.m.cfg.RetryInterval)
			e.tick()
			e.wantStates(n0.Name, AdminStateDown)
			e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
		})
	}
}

// A 409 spends a retry and is retried after a fresh Get.
func TestConflictRetriesAfterFreshGet(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusConflict, Times: 1})
	before := successes()
	failuresBefore := failures()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	gets := e.gets(publicPool)
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	if e.gets(publicPool) != gets+1 {
		t.Errorf("retry without a fresh Get")
	}
	e.wantStates(n0.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
	if got := successes() - before; got != 2 {
		t.Errorf("success metric +%v, want +2 (one per pool, the retried one counted once)", got)
	}
	if failures() != failuresBefore {
		t.Errorf("failure metric recorded for a retried-then-succeeded update")
	}
}

func TestConcurrentWriterBetweenGetAndPut(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	other := &armnetwork.LoadBalancerBackendAddress{Name: ptr.To("other-writer-node"), Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: ptr.To("10.224.9.9")}}
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Times: 1, Before: func() {
		e.emu.MutatePool("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
			p.Properties.LoadBalancerBackendAddresses = append(p.Properties.LoadBalancerBackendAddresses, other)
		})
	}})
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	var saw412 bool
	for _, r := range e.emu.Requests() {
		saw412 = saw412 || (r.Method == http.MethodPut && r.Status == http.StatusPreconditionFailed)
	}
	if !saw412 {
		t.Fatalf("the stale ETag was not refused with 412")
	}
	// A 412 is re-read and re-applied at once: no retry spent, no event.
	e.wantStates(n0.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonDown)
	if got := e.state("kubernetes", "kubernetes", "other-writer-node"); got != "None" {
		t.Errorf("the other writer's entry was lost (state %q)", got)
	}
	e.wantConfirmed(n0, AdminStateDown)
}

func TestRetryExhaustion(t *testing.T) {
	e := newEnv(t, 2, false, withMaxRetries(2))
	n0 := e.nodes[0]
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusConflict})
	before := failures()
	e.m.SetDesired(n0, AdminStateDown)
	for range 3 {
		e.tick()
		e.step(e.m.cfg.RetryInterval)
	}
	e.tick() // within the backoff that follows: no call
	if got := e.puts(publicPool); got != 3 {
		t.Errorf("%d PUTs, want 3 (one attempt and 2 retries)", got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonUpdateRetrying, ReasonUpdateFailed)
	evs := e.rec.all()
	if last := evs[len(evs)-1].note; !strings.Contains(last, "after 2 retries") || !strings.Contains(last, "tried again at") {
		t.Errorf("exhaustion event lacks retry count or guidance: %q", last)
	}
	if got := failures() - before; got != 1 {
		t.Errorf("failure metric +%v, want +1", got)
	}
	var ufe *UpdateFailedError
	if err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown); !errors.As(err, &ufe) || ufe.Retries != 2 {
		t.Errorf("WaitConfirmed = %v, want an UpdateFailedError after 2 retries", err)
	}
}

func TestMaxRetriesZeroDisablesRetry(t *testing.T) {
	e := newEnv(t, 2, false, withMaxRetries(0))
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusConflict})
	e.m.SetDesired(e.nodes[0], AdminStateDown)
	e.tick()
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	e.wantReasons(e.nodes[0].Name, ReasonUpdateFailed)
	if got := e.puts(publicPool); got != 1 {
		t.Errorf("%d PUTs, want 1", got)
	}
}

func TestMixedRetryBudgetsInOneGroup(t *testing.T) {
	e := newEnv(t, 3, false, withMaxRetries(1))
	n0, n1 := e.nodes[0], e.nodes[1]
	remove := e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusConflict})
	e.m.SetDesired(n0, AdminStateDown)
	e.tick() // n0: retry 1 of 1
	e.m.SetDesired(n1, AdminStateDown)
	e.step(e.m.cfg.RetryInterval)
	e.tick() // one failed attempt for the group: n0 exhausted, n1 retries
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonUpdateFailed)
	e.wantReasons(n1.Name, ReasonUpdateRetrying)
	remove()
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	e.wantStates(n1.Name, AdminStateDown)
	e.wantConfirmed(n1, AdminStateDown)
	e.wantReasons(n1.Name, ReasonUpdateRetrying, ReasonDown)
	// The desired-state model writes n0's entry too in the pool's one call.
	e.wantStates(n0.Name, AdminStateDown)
}

func TestStalePoolDroppedQuietly(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.emu.DeletePool("kubernetes", "kubernetes")
	before := failures()
	gets := e.gets(publicPool)
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("internal pool = %s, want Down", got)
	}
	e.wantConfirmed(n0, AdminStateDown)
	e.wantReasons(n0.Name, ReasonDown)
	if failures() != before {
		t.Errorf("404 recorded as a failure")
	}
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	if got := e.gets(publicPool) - gets; got != 1 {
		t.Errorf("%d GETs of the gone pool, want 1 (no retry)", got)
	}
}

func TestTerminalErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault armemulator.Fault
		async bool
		// requests the SDK makes for the failing call
		wantCalls int
	}{
		{"500 already retried by the SDK", armemulator.Fault{Method: http.MethodGet, Path: publicPool, Status: http.StatusInternalServerError}, false, 4},
		{"503 already retried by the SDK", armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusServiceUnavailable}, false, 4},
		{"400", armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusBadRequest}, false, 1},
		{"403", armemulator.Fault{Method: http.MethodGet, Path: publicPool, Status: http.StatusForbidden}, false, 1},
		{"failed long-running write", armemulator.Fault{Method: http.MethodPut, Path: publicPool, OperationStatus: "Failed"}, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []envOption
			if tc.async {
				opts = append(opts, withAsync())
			}
			e := newEnv(t, 2, false, opts...)
			n0 := e.nodes[0]
			e.emu.AddFault(tc.fault)
			before := failures()
			e.m.SetDesired(n0, AdminStateDown)
			e.tick()
			if got := e.emu.Count(tc.fault.Method, publicPool); got != tc.wantCalls {
				t.Errorf("%d %s calls, want %d", got, tc.fault.Method, tc.wantCalls)
			}
			e.step(e.m.cfg.RetryInterval)
			e.tick()
			if got := e.emu.Count(tc.fault.Method, publicPool); got != tc.wantCalls {
				t.Errorf("terminal error retried: %d calls", got)
			}
			e.wantReasons(n0.Name, ReasonUpdateFailed)
			if evs := e.rec.all(); !strings.Contains(evs[0].note, "tried again at") || evs[0].typ != corev1.EventTypeWarning {
				t.Errorf("failed event = %+v", evs[0])
			}
			if got := failures() - before; got != 1 {
				t.Errorf("failure metric +%v, want +1", got)
			}
			if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
				t.Errorf("internal pool = %s, want Down despite the other pool failing", got)
			}
			var ufe *UpdateFailedError
			if err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown); !errors.As(err, &ufe) {
				t.Errorf("WaitConfirmed = %v, want UpdateFailedError", err)
			}
		})
	}
}

func TestCanceledLongRunningWriteRetries(t *testing.T) {
	e := newEnv(t, 2, false, withAsync())
	n0 := e.nodes[0]
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, OperationStatus: "Canceled", Times: 1})
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("canceled write was applied: %s", got)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
}

func TestShutdownEmitsNothing(t *testing.T) {
	t.Run("parked work", func(t *testing.T) {
		e := newEnv(t, 2, false)
		e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: publicPool, Status: http.StatusTooManyRequests, RetryAfter: "60"})
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error)
		go func() { done <- e.m.Start(ctx) }()
		e.m.SetDesired(e.nodes[0], AdminStateDown)
		waitFor(t, func() bool { return len(e.rec.all()) == 1 })
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		e.wantReasons(e.nodes[0].Name, ReasonUpdateRetrying)
		if err := e.m.WaitConfirmed(e.ctx, e.nodes[0].UID, AdminStateDown); !errors.Is(err, ErrStopped) {
			t.Errorf("WaitConfirmed after stop = %v, want ErrStopped", err)
		}
	})
	t.Run("in-flight call", func(t *testing.T) {
		e := newEnv(t, 2, false)
		started := make(chan struct{})
		var once sync.Once
		e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: publicPool, Hang: true, Before: func() { once.Do(func() { close(started) }) }})
		before := failures()
		ctx, cancel := context.WithCancel(e.ctx)
		e.m.SetDesired(e.nodes[0], AdminStateDown)
		done := make(chan struct{})
		go func() { e.m.tick(ctx); close(done) }()
		<-started
		cancel()
		<-done
		for _, ev := range e.rec.all() {
			if ev.typ == corev1.EventTypeWarning {
				t.Errorf("event at shutdown: %+v", ev)
			}
		}
		if failures() != before {
			t.Errorf("failure metric at shutdown")
		}
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not waiting for one
	}
}

func TestResyncRepairsPoolRewrittenByAnotherWriter(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	// cloud-provider-azure rewrites the pool without admin state.
	e.emu.MutatePool("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			a.Properties.AdminState = nil
		}
	})
	e.tick()
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("repaired before the resync: %s", got)
	}
	e.step(e.m.cfg.ResyncInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
}

func TestForgetAndWait(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	if err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown); !errors.Is(err, ErrNotTracked) {
		t.Errorf("WaitConfirmed on an unknown node = %v, want ErrNotTracked", err)
	}
	e.m.SetDesired(n0, AdminStateDown)
	errc := make(chan error, 1)
	go func() { errc <- e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown) }()
	e.m.Forget(n0.UID)
	if err := <-errc; !errors.Is(err, ErrForgotten) && !errors.Is(err, ErrNotTracked) {
		t.Errorf("WaitConfirmed after Forget = %v, want ErrForgotten", err)
	}
	e.tick()
	if got := e.puts(""); got != 0 {
		t.Errorf("%d PUTs for a forgotten node", got)
	}
	// A node without entries is confirmed at once.
	ghost := testNode("not-in-any-pool", "10.99.0.1")
	e.m.SetDesired(ghost, AdminStateDown)
	e.tick()
	e.wantConfirmed(ghost, AdminStateDown)
}

func TestNICBasedPools(t *testing.T) {
	vmss := "azure:///subscriptions/" + testSub + "/resourceGroups/" + strings.ToUpper(testRG) + "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-vmss/virtualMachines/"
	vm := "azure:///subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachines/"
	seedNodes := []armemulator.Node{
		{Name: "aks-nodepool1-vmss000000", IPs: []string{"10.224.0.4"}, ProviderID: vmss + "0"},
		{Name: "aks-nodepool1-vmss000001", IPs: []string{"10.224.0.5"}, ProviderID: vmss + "1"},
		{Name: "aks-vmas-0", IPs: []string{"10.224.0.6"}, ProviderID: vm + "aks-vmas-0"},
	}
	var nodes []*corev1.Node
	for _, n := range seedNodes {
		kn := testNode(n.Name, n.IPs...)
		kn.Spec.ProviderID = n.ProviderID
		nodes = append(nodes, kn)
	}
	e := newEnvWithSeed(t, armemulator.SeedForNodes(testSub, testRG, seedNodes, armemulator.Topology{NICBased: true, Internal: true}), nodes)
	e.m.SetDesired(nodes[0], AdminStateDown)
	e.m.SetDesired(nodes[2], AdminStateDown)
	e.m.SetDesired(nodes[1], AdminStateNone)
	e.tick()
	for i, want := range []string{"Down", "None", "Down"} {
		if got := e.state("kubernetes", "kubernetes", testRG+"-"+nodes[i].Name); got != want {
			t.Errorf("NIC-based entry of %s = %s, want %s", nodes[i].Name, got, want)
		}
		if got := e.state("kubernetes-internal", "kubernetes", nodes[i].Name); got != want {
			t.Errorf("IP-based entry of %s = %s, want %s", nodes[i].Name, got, want)
		}
	}
	for i, want := range []AdminState{AdminStateDown, AdminStateNone, AdminStateDown} {
		e.wantConfirmed(nodes[i], want)
	}
	nicGets := e.emu.Count(http.MethodGet, "/networkInterfaces/")
	if nicGets != 1 {
		t.Errorf("%d NIC GETs, want 1 (only the VMAS NIC, cached)", nicGets)
	}
	e.m.SetDesired(nodes[2], AdminStateNone)
	e.tick()
	if got := e.emu.Count(http.MethodGet, "/networkInterfaces/"); got != nicGets {
		t.Errorf("NIC looked up again (%d GETs): cache not used", got)
	}
}

func TestStartConvergesWithRealClock(t *testing.T) {
	e := newEnv(t, 20, false)
	e.m.clock = clock.RealClock{}
	e.m.cfg.RetryInterval = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go func() { _ = e.m.Start(ctx) }()
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: internalPool, Status: http.StatusConflict, Times: 1})
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateDown)
	}
	for _, n := range e.nodes {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := e.m.WaitConfirmed(wctx, n.UID, AdminStateDown); err != nil {
			t.Fatalf("WaitConfirmed(%s): %v", n.Name, err)
		}
		wcancel()
		e.wantStates(n.Name, AdminStateDown)
	}
}
