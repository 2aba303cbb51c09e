package agentpools

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/upgrade"
)

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "t", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// recording is the HTTP client, keeping each request's api-version.
type recording struct {
	mu          sync.Mutex
	apiVersions []string
}

func (r *recording) Do(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.apiVersions = append(r.apiVersions, req.URL.Query().Get("api-version"))
	r.mu.Unlock()
	return http.DefaultClient.Do(req)
}

var cluster = config.ManagedCluster{SubscriptionID: "sub", ResourceGroup: "rg", Name: "aks1"}

func newPoller(t *testing.T) (*Poller, *armemulator.Server, *recording) {
	t.Helper()
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.Seed{Subscription: "sub", ResourceGroup: "MC_rg_aks1_westeurope",
		ManagedCluster: &armemulator.ManagedClusterSeed{Name: "aks1", ResourceGroup: "rg", AgentPools: []armemulator.AgentPoolSeed{
			{Name: "system", Count: 3, Mode: "System"},
			{Name: "user", Count: 10, UpgradeSettings: armemulator.AgentPoolUpgradeSettings{
				MaxSurge: "0", MaxUnavailable: "2", DrainTimeoutInMinutes: 45, NodeSoakDurationInMinutes: 5, UndrainableNodeBehavior: "Cordon",
			}},
		}},
	}, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	rec := &recording{}
	p, err := New(Settings{
		Cluster: cluster, Credential: staticToken{}, InsecureAllowHTTP: true, Transport: rec,
		Cloud: cloud.Configuration{ActiveDirectoryAuthorityHost: "https://login.example/", Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: emu.URL(), Audience: emu.URL()},
		}},
		Retry:    policy.RetryOptions{MaxRetries: -1}, // a failure is the read's at once
		Interval: 20 * time.Millisecond,
		Timeout:  5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, emu, rec
}

var userSettings = upgrade.Settings{Pool: "user", MaxSurge: "0", MaxUnavailable: "2", DrainTimeout: 45 * time.Minute, NodeSoak: 5 * time.Minute, UndrainableNodeBehavior: "Cordon"}

func TestReadsEverySetting(t *testing.T) {
	p, _, rec := newPoller(t)
	if pools, err := p.AgentPools(); pools != nil || err != ErrNotRead {
		t.Fatalf("before a read: %v, %v; want nil, ErrNotRead", pools, err)
	}
	successes := testutil.ToFloat64(reads.WithLabelValues("success"))
	if err := p.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	pools, err := p.AgentPools()
	if err != nil {
		t.Fatal(err)
	}
	if pools["user"] != userSettings {
		t.Errorf("user = %+v, want %+v", pools["user"], userSettings)
	}
	// Unset settings stay unset: package upgrade applies AKS's defaults.
	if want := (upgrade.Settings{Pool: "system"}); len(pools) != 2 || pools["system"] != want {
		t.Errorf("pools = %+v, want system unset", pools)
	}
	if got := rec.apiVersions; len(got) != 1 || got[0] != APIVersion {
		t.Errorf("api-versions sent = %v, want [%s]", got, APIVersion)
	}
	if d := testutil.ToFloat64(reads.WithLabelValues("success")) - successes; d != 1 {
		t.Errorf("nodeguard_aks_agent_pool_reads_total{result=success} rose by %v", d)
	}
	if n := testutil.ToFloat64(poolsRead); n != 2 {
		t.Errorf("nodeguard_aks_agent_pools = %v", n)
	}
	// The caller's copy is its own.
	pools["user"] = upgrade.Settings{}
	if again, _ := p.AgentPools(); again["user"] != userSettings {
		t.Error("AgentPools returned the poller's own map")
	}
}

func expectEvent(t *testing.T, p *Poller, want bool, why string) {
	t.Helper()
	select {
	case ev := <-p.Events():
		if !want {
			t.Errorf("%s: an event", why)
		} else if ev.Object == nil {
			t.Errorf("%s: an event without an object", why)
		}
	default:
		if want {
			t.Errorf("%s: no event", why)
		}
	}
}

// A failing read keeps the settings last read and returns its error; events
// come on a change and when a read starts or stops failing, never for a read
// that changed nothing.
func TestFailuresAndEvents(t *testing.T) {
	ctx := context.Background()
	p, emu, _ := newPoller(t)
	_ = p.Read(ctx)
	expectEvent(t, p, true, "first read")
	_ = p.Read(ctx)
	expectEvent(t, p, false, "same settings")

	for _, status := range []int{http.StatusInternalServerError, http.StatusForbidden} {
		errors := testutil.ToFloat64(reads.WithLabelValues("error"))
		remove := emu.AddFault(armemulator.Fault{Path: "/agentPools", Status: status})
		if err := p.Read(ctx); err == nil {
			t.Fatalf("%d: read succeeded", status)
		}
		pools, err := p.AgentPools()
		if err == nil || pools["user"] != userSettings {
			t.Errorf("%d: AgentPools = %v, %v; want the last good settings and the error", status, pools, err)
		}
		expectEvent(t, p, true, "failing")
		_ = p.Read(ctx)
		expectEvent(t, p, false, "still failing")
		if d := testutil.ToFloat64(reads.WithLabelValues("error")) - errors; d != 2 {
			t.Errorf("nodeguard_aks_agent_pool_reads_total{result=error} rose by %v", d)
		}
		remove()
		if err := p.Read(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := p.AgentPools(); err != nil {
			t.Errorf("after recovery: %v", err)
		}
		expectEvent(t, p, true, "recovered")
	}

	emu.SetAgentPoolUpgradeSettings("user", armemulator.AgentPoolUpgradeSettings{MaxSurge: "1"})
	_ = p.Read(ctx)
	expectEvent(t, p, true, "changed")
	if pools, _ := p.AgentPools(); pools["user"] != (upgrade.Settings{Pool: "user", MaxSurge: "1"}) {
		t.Errorf("after the change: %+v", pools["user"])
	}

	// Events coalesce: a consumer that lags gets one.
	emu.SetAgentPoolUpgradeSettings("user", armemulator.AgentPoolUpgradeSettings{MaxSurge: "2"})
	_ = p.Read(ctx)
	emu.SetAgentPoolUpgradeSettings("user", armemulator.AgentPoolUpgradeSettings{MaxSurge: "3"})
	_ = p.Read(ctx)
	expectEvent(t, p, true, "two changes")
	expectEvent(t, p, false, "two changes, coalesced")
}

// Start reads at once and then every Interval on every replica, until its
// context ends.
func TestStart(t *testing.T) {
	p, emu, _ := newPoller(t)
	if p.NeedLeaderElection() {
		t.Error("the poller waits for leader election")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Start(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for emu.Count(http.MethodGet, "/agentPools") < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start = %v", err)
	}
	if n := emu.Count(http.MethodGet, "/agentPools"); n < 3 {
		t.Errorf("%d reads in 10s at a 20ms interval", n)
	}
	if pools, err := p.AgentPools(); err != nil || len(pools) != 2 {
		t.Errorf("AgentPools = %v, %v", pools, err)
	}
}

func TestNewNeedsACluster(t *testing.T) {
	if _, err := New(Settings{Credential: staticToken{}}); err == nil || !strings.Contains(err.Error(), "managed cluster") {
		t.Errorf("New without a cluster = %v", err)
	}
	if _, err := New(Settings{Cluster: cluster}); err == nil || !strings.Contains(err.Error(), "credential") {
		t.Errorf("New without a credential = %v", err)
	}
}
