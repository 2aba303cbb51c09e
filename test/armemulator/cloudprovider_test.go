package armemulator

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// TestCloudProviderActorPlaysItsReconcile: the actor's pool PUT carries no
// If-Match and writes the pool as it read it (a Down set meanwhile is put
// back, a new node comes in at None, a gone one is removed), and its cached
// whole-LB PUT meets 412 after another write, then reads afresh.
func TestCloudProviderActorPlaysItsReconcile(t *testing.T) {
	nodes := []Node{{Name: "n0", IPs: []string{"10.0.0.4"}}, {Name: "n1", IPs: []string{"10.0.0.5"}}}
	s, err := Start("127.0.0.1:0", SeedForNodes("sub", "rg", nodes, Topology{}), Options{Async: true, AsyncPolls: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	cp := NewCloudProvider(s)
	if err := cp.UpdateLoadBalancer(ctx, "kubernetes"); err != nil { // fills its cache
		t.Fatal(err)
	}
	snap, err := cp.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.MutatePool("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
		p.Properties.LoadBalancerBackendAddresses[0].Properties.AdminState = ptr(armnetwork.LoadBalancerBackendAddressAdminStateDown)
	})
	joined := []Node{nodes[0], {Name: "n2", IPs: []string{"10.0.0.6"}}}
	wrote, err := snap.EnsureHostsInPool(ctx, "kubernetes", "kubernetes", joined)
	if err != nil || len(wrote) != 2 {
		t.Fatalf("EnsureHostsInPool = %v, %v; want n0 kept, n1 removed, n2 added", wrote, err)
	}
	states := s.AdminStates()
	if states["kubernetes/kubernetes/n0"] != "None" || states["kubernetes/kubernetes/n2"] != "None" || states["kubernetes/kubernetes/n1"] != "" {
		t.Errorf("pool after the stale PUT: %v; want n0 put back to None, n2 added at None, n1 gone", states)
	}
	for _, r := range s.Requests() {
		if r.Method == http.MethodPut && Kind(r.Path) == "backendAddressPool" && r.IfMatch != "" {
			t.Errorf("pool PUT with If-Match %q: cloud-provider-azure's backend-pool client sends none", r.IfMatch)
		}
	}

	// Its cached copy (taken before both writes) meets 412, then it refreshes.
	cp.CacheTTL = DefaultLBCacheTTL
	if err := cp.UpdateLoadBalancer(ctx, "kubernetes"); err != nil {
		t.Fatalf("first whole-LB PUT after a fresh GET: %v", err)
	}
	if _, err := cp.cachedLB(ctx, "kubernetes"); err != nil {
		t.Fatal(err)
	}
	s.MutatePool("kubernetes", "kubernetes", func(*armnetwork.BackendAddressPool) {})
	var se *StatusError
	if err := cp.UpdateLoadBalancer(ctx, "kubernetes"); !errors.As(err, &se) || se.Status != http.StatusPreconditionFailed {
		t.Fatalf("whole-LB PUT from a stale cache = %v, want 412", err)
	}
	if err := cp.UpdateLoadBalancer(ctx, "kubernetes"); err != nil {
		t.Fatalf("whole-LB PUT after the 412 dropped the cache: %v", err)
	}
	if st := cp.Stats(); st.LBPut412 != 1 || st.PoolPuts != 1 || st.Lists != 1 {
		t.Errorf("stats %+v", st)
	}
}
