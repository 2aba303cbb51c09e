package armclient

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "t", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

const poolPath = "/loadBalancers/kubernetes/backendAddressPools/kubernetes"

func newClient(t *testing.T, opts armemulator.Options) (Client, *armemulator.Server, *testingclock.FakeClock) {
	t.Helper()
	return newClientFor(t, armemulator.Topology{}, opts)
}

func newClientFor(t *testing.T, topology armemulator.Topology, opts armemulator.Options) (Client, *armemulator.Server, *testingclock.FakeClock) {
	t.Helper()
	seed := armemulator.SeedForNodes("sub", "rg", []armemulator.Node{{Name: "n0", IPs: []string{"10.0.0.4"}}}, topology)
	emu, err := armemulator.Start("127.0.0.1:0", seed, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	clk := testingclock.NewFakeClock(time.Now())
	return newClientWith(t, emu.URL(), clk), emu, clk
}

// newClientAt returns a client of the endpoint at url.
func newClientAt(t *testing.T, url string) Client {
	t.Helper()
	return newClientWith(t, url, testingclock.NewFakeClock(time.Now()))
}

func newClientWith(t *testing.T, url string, clk *testingclock.FakeClock) Client {
	t.Helper()
	c, err := New(Settings{
		SubscriptionID: "sub", Credential: staticToken{}, InsecureAllowHTTP: true, Clock: clk,
		Cloud: cloud.Configuration{ActiveDirectoryAuthorityHost: "https://login.example/", Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: url, Audience: url},
		}},
		Retry:         policy.RetryOptions{RetryDelay: time.Millisecond, MaxRetryDelay: 2 * time.Millisecond},
		PollFrequency: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return WithMetrics(c)
}

func TestThrottleErrorPaths(t *testing.T) {
	ctx := context.Background()
	c, emu, clk := newClient(t, armemulator.Options{})
	emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: poolPath, Status: http.StatusTooManyRequests, RetryAfter: "10", Times: 1})

	// ARM path: the 429 becomes a ThrottleError with Retry-After, not retried by the SDK.
	_, err := c.GetPool(ctx, "rg", "kubernetes", "kubernetes")
	var te *ThrottleError
	if !errors.As(err, &te) || te.FromGate || !te.RetryAfter.Equal(clk.Now().Add(10*time.Second)) {
		t.Fatalf("GetPool = %v, want an ARM ThrottleError retrying after 10s", err)
	}
	if !errors.Is(err, ErrTooManyRequests) {
		t.Errorf("ThrottleError does not unwrap to ErrTooManyRequests")
	}
	if n := emu.Count(http.MethodGet, poolPath); n != 1 {
		t.Errorf("%d GETs, want 1", n)
	}

	// Local gate path: no request reaches ARM before Retry-After.
	clk.Step(5 * time.Second)
	_, err = c.GetPool(ctx, "rg", "kubernetes", "kubernetes")
	if !errors.As(err, &te) || !te.FromGate || !te.RetryAfter.After(clk.Now()) {
		t.Fatalf("GetPool = %v, want a gate ThrottleError", err)
	}
	if n := emu.Count(http.MethodGet, poolPath); n != 1 {
		t.Errorf("gate let a request through: %d GETs", n)
	}
	// Other resources are not gated.
	if _, err := c.GetLoadBalancer(ctx, "rg", "kubernetes"); err != nil {
		t.Errorf("other resource gated: %v", err)
	}

	clk.Step(6 * time.Second)
	if _, err := c.GetPool(ctx, "rg", "kubernetes", "kubernetes"); err != nil {
		t.Fatalf("after Retry-After: %v", err)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in     string
		want   time.Time
		wantOK bool
	}{
		{"", now, true},
		{"7", now.Add(7 * time.Second), true},
		{"Fri, 02 Jan 2026 03:05:00 GMT", time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC), true},
		{"later", time.Time{}, false},
	} {
		got, ok := parseRetryAfter(tc.in, now)
		if ok != tc.wantOK || !got.Equal(tc.want) {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestUpdatePoolIfMatchAndAsync(t *testing.T) {
	for _, async := range []bool{false, true} {
		ctx := context.Background()
		c, emu, _ := newClient(t, armemulator.Options{Async: async, AsyncPolls: 2})
		p, err := c.GetPool(ctx, "rg", "kubernetes", "kubernetes")
		if err != nil {
			t.Fatal(err)
		}
		stale := *p.Etag
		p.Properties.LoadBalancerBackendAddresses[0].Properties.AdminState = ptr.To(armnetwork.LoadBalancerBackendAddressAdminStateDown)
		if _, err := c.UpdatePool(ctx, "rg", "kubernetes", p); err != nil {
			t.Fatalf("async=%v: UpdatePool: %v", async, err)
		}
		if got := emu.AdminStates()["kubernetes/kubernetes/n0"]; got != "Down" {
			t.Errorf("async=%v: admin state %s after the write completed", async, got)
		}
		// If-Match is the PUT's alone, as cloud-provider-azure's ETag policy
		// sends it: the operation's polls and the final GET of the pool come
		// after the PUT moved the ETag, and a stale If-Match on them asks ARM
		// for a 412.
		for _, r := range emu.Requests() {
			if r.Method == http.MethodGet && r.IfMatch != "" {
				t.Errorf("async=%v: GET %s carried If-Match %s", async, r.Path, r.IfMatch)
			}
		}
		// The ETag moved: a write with the old one is refused.
		p.Etag = &stale
		_, err = c.UpdatePool(ctx, "rg", "kubernetes", p)
		var re *azcore.ResponseError
		if !errors.As(err, &re) || re.StatusCode != http.StatusPreconditionFailed {
			t.Errorf("async=%v: stale write = %v, want 412", async, err)
		}
	}
}

// A write's 429 gates every write in the subscription (ARM's write budget is
// per subscription), while reads go on.
func TestWriteThrottleGatesTheSubscription(t *testing.T) {
	ctx := context.Background()
	c, emu, clk := newClient(t, armemulator.Options{WriteThrottle: &armemulator.WriteThrottle{Writes: 1, Window: time.Hour}})
	write := func(lb, pool string) error {
		p, err := c.GetPool(ctx, "rg", lb, pool)
		if err != nil {
			t.Fatalf("GetPool %s/%s: %v", lb, pool, err)
		}
		_, err = c.UpdatePool(ctx, "rg", lb, p)
		return err
	}
	if err := write("kubernetes", "kubernetes"); err != nil {
		t.Fatalf("first write: %v", err)
	}
	var te *ThrottleError
	if err := write("kubernetes", "kubernetes"); !errors.As(err, &te) || te.FromGate {
		t.Fatalf("second write = %v, want ARM's 429 as a ThrottleError", err)
	}
	puts := emu.Count(http.MethodPut, "")
	clk.Step(time.Second)
	// Another pool: same subscription, so gated locally.
	if err := write("kubernetes", "aksOutboundBackendPool"); !errors.As(err, &te) || !te.FromGate {
		t.Fatalf("write to another load balancer = %v, want a gate ThrottleError", err)
	}
	if got := emu.Count(http.MethodPut, ""); got != puts {
		t.Errorf("the gate let a write through: %d PUTs, want %d", got, puts)
	}
	if GateKey(http.MethodPut, "/subscriptions/A/resourceGroups/x") != GateKey(http.MethodPut, "/subscriptions/a/resourceGroups/y/z") {
		t.Errorf("writes of one subscription fall under different gates")
	}
	if GateKey(http.MethodPut, "/subscriptions/a/x") == GateKey(http.MethodPut, "/subscriptions/b/x") {
		t.Errorf("two subscriptions share a write gate")
	}
}

// A load balancer another operation is updating answers 429 RetryableError.
// That is not the subscription's write budget: it gates writes to that load
// balancer only, and other load balancers are written at once.
func TestBusyLoadBalancerGatesOnlyItsOwnWrites(t *testing.T) {
	ctx := context.Background()
	c, emu, clk := newClientFor(t, armemulator.Topology{Internal: true}, armemulator.Options{BusyRetryAfter: 10 * time.Second})
	write := func(lb, pool string) error {
		p, err := c.GetPool(ctx, "rg", lb, pool)
		if err != nil {
			t.Fatalf("GetPool %s/%s: %v", lb, pool, err)
		}
		_, err = c.UpdatePool(ctx, "rg", lb, p)
		return err
	}
	end := emu.BeginOperation("kubernetes")
	var te *ThrottleError
	if err := write("kubernetes", "kubernetes"); !errors.As(err, &te) || te.FromGate || !te.ResourceBusy {
		t.Fatalf("write to the busy load balancer = %v, want ARM's 429 as a resource-busy ThrottleError", err)
	}
	if want := clk.Now().Add(10 * time.Second); !te.RetryAfter.Equal(want) {
		t.Errorf("RetryAfter = %v, want %v", te.RetryAfter, want)
	}
	if err := write("kubernetes-internal", "kubernetes"); err != nil {
		t.Errorf("write to another load balancer of the subscription = %v, want it through", err)
	}
	puts := emu.Count(http.MethodPut, "/loadBalancers/kubernetes/")
	if err := write("kubernetes", "aksOutboundBackendPool"); !errors.As(err, &te) || !te.FromGate || !te.ResourceBusy {
		t.Errorf("write to a sibling pool of the busy load balancer = %v, want a gate ThrottleError", err)
	}
	if got := emu.Count(http.MethodPut, "/loadBalancers/kubernetes/"); got != puts {
		t.Errorf("the gate let a write to the busy load balancer through: %d PUTs, want %d", got, puts)
	}
	end()
	clk.Step(10 * time.Second)
	if err := write("kubernetes", "kubernetes"); err != nil {
		t.Errorf("write after the operation ended and Retry-After passed = %v", err)
	}
}
