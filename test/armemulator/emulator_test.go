package armemulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestWireFormatAndControl(t *testing.T) {
	seed := SeedForNodes("sub", "RG", []Node{
		{Name: "n0", IPs: []string{"10.0.0.4", "fd00::4"}, ProviderID: "azure:///subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/n0"},
	}, Topology{NICBased: true, Internal: true})
	s, err := Start("127.0.0.1:0", seed, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	get := func(path string) (int, map[string]any) {
		resp, err := http.Get(s.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	// Paths are case-insensitive, as in ARM.
	code, lbs := get("/subscriptions/sub/resourcegroups/rg/providers/microsoft.network/loadBalancers?api-version=2025-05-01")
	if code != 200 || len(lbs["value"].([]any)) != 2 {
		t.Fatalf("list = %d %v", code, lbs)
	}
	code, pool := get("/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes")
	props := pool["properties"].(map[string]any)
	if code != 200 || pool["etag"] == nil || props["backendIPConfigurations"] == nil {
		t.Fatalf("pool = %d %v", code, pool)
	}
	code, nic := get("/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/networkInterfaces/n0-nic")
	if code != 200 || !strings.HasSuffix(nic["properties"].(map[string]any)["virtualMachine"].(map[string]any)["id"].(string), "/virtualMachines/n0") {
		t.Fatalf("nic = %d %v", code, nic)
	}
	s.AddFault(Fault{Path: "/backendAddressPools/kubernetes-IPv6", Status: 429, RetryAfter: "3", Times: 1})
	resp, err := http.Get(s.URL() + "/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes-IPv6")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("fault = %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if code, _ := get("/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes-IPv6"); code != 200 {
		t.Errorf("fault outlived Times: %d", code)
	}
	s.AddFault(Fault{Path: "/loadBalancers/kubernetes-internal", Delay: 50 * time.Millisecond, Times: 1})
	start := time.Now()
	get("/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/kubernetes-internal")
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("latency not added")
	}
	if n := s.Count(http.MethodGet, "/backendaddresspools/KUBERNETES-IPV6"); n != 2 {
		t.Errorf("Count = %d, want 2", n)
	}
	resp, err = http.Get(s.URL() + "/emulator/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state []PoolState
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	if len(state) != 5 { // kubernetes: kubernetes, -IPv6, outbound; internal: kubernetes, -IPv6
		t.Errorf("state has %d pools: %+v", len(state), state)
	}
}

// armRules covers the ARM rules the emulator plays: one ETag per load
// balancer, NIC members without entries, read-only NIC references, and the
// per-subscription write budget.
func TestARMRules(t *testing.T) {
	vm := "/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/"
	seed := SeedForNodes("sub", "RG", []Node{
		{Name: "n0", IPs: []string{"10.0.0.4", "fd00::4"}, ProviderID: "azure://" + vm + "n0"},
		{Name: "n1", IPs: []string{"10.0.0.5", "fd00::5"}, ProviderID: "azure://" + vm + "n1"},
	}, Topology{NICBased: true, MembersOnly: true, Internal: true})
	s, err := Start("127.0.0.1:0", seed, Options{WriteThrottle: &WriteThrottle{Writes: 2, Window: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := s.URL() + "/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/"
	put := func(path, ifMatch string, pool any) int {
		b, _ := json.Marshal(pool)
		req, _ := http.NewRequest(http.MethodPut, base+path, strings.NewReader(string(b)))
		req.Header.Set("If-Match", ifMatch)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	v4, v6 := s.Pool("kubernetes", "kubernetes"), s.Pool("kubernetes", "kubernetes-IPv6")
	internal := s.Pool("kubernetes-internal", "kubernetes")
	if *v4.Etag != *v6.Etag {
		t.Fatalf("pools of one load balancer report different ETags: %s, %s", *v4.Etag, *v6.Etag)
	}
	if *v4.Etag == *internal.Etag {
		t.Fatalf("two load balancers share an ETag")
	}
	if got := len(v4.Properties.LoadBalancerBackendAddresses); got != 0 || len(v4.Properties.BackendIPConfigurations) != 2 {
		t.Fatalf("members-only NIC pool: %d entries, %d backendIPConfigurations; want 0 and 2", got, len(v4.Properties.BackendIPConfigurations))
	}

	// A write to the IPv6 pool changes the ETag the IPv4 pool reports.
	if code := put("kubernetes/backendAddressPools/kubernetes-IPv6", *v6.Etag, v6); code != http.StatusOK {
		t.Fatalf("PUT IPv6 pool = %d", code)
	}
	if now := s.Pool("kubernetes", "kubernetes"); *now.Etag == *v4.Etag {
		t.Errorf("IPv4 pool's ETag unchanged by a write to its sibling")
	}
	if got := *s.Pool("kubernetes-internal", "kubernetes").Etag; got != *internal.Etag {
		t.Errorf("another load balancer's ETag changed")
	}
	// ... so a write with the ETag read before it is refused.
	adminDown := "Down"
	nicEntry := map[string]any{"name": "n0", "properties": map[string]any{
		"adminState":                      adminDown,
		"networkInterfaceIPConfiguration": map[string]any{"id": *v4.Properties.BackendIPConfigurations[0].ID},
	}}
	v4.Properties.LoadBalancerBackendAddresses = nil
	body := map[string]any{"name": "kubernetes", "properties": map[string]any{"loadBalancerBackendAddresses": []any{nicEntry}}}
	if code := put("kubernetes/backendAddressPools/kubernetes", *v4.Etag, body); code != http.StatusPreconditionFailed {
		t.Errorf("PUT with a sibling's stale ETag = %d, want 412", code)
	}
	if n := s.Status(http.MethodPut, "/backendAddressPools/", http.StatusPreconditionFailed); n != 1 {
		t.Errorf("Status counted %d 412s, want 1", n)
	}
	// networkInterfaceIPConfiguration is read-only: a new NIC entry is ignored.
	fresh := s.Pool("kubernetes", "kubernetes")
	if code := put("kubernetes/backendAddressPools/kubernetes", *fresh.Etag, body); code != http.StatusOK {
		t.Fatalf("PUT with the fresh ETag = %d", code)
	}
	if got := s.Pool("kubernetes", "kubernetes").Properties.LoadBalancerBackendAddresses; len(got) != 0 {
		t.Errorf("a PUT added a NIC-based entry: %d entries", len(got))
	}
	// Two writes spent the budget of 2: the third is throttled.
	fresh = s.Pool("kubernetes-internal", "kubernetes")
	if code := put("kubernetes-internal/backendAddressPools/kubernetes", *fresh.Etag, fresh); code != http.StatusTooManyRequests {
		t.Errorf("write past the subscription's budget = %d, want 429", code)
	}
}

// While an asynchronous write to one pool is in progress, ARM refuses writes
// to the load balancer's other pools with 429 RetryableError, as it does for
// an operation by another writer; both end when the operation does.
func TestBusyLoadBalancerRefusesWrites(t *testing.T) {
	seed := SeedForNodes("sub", "RG", []Node{{Name: "n0", IPs: []string{"10.0.0.4"}}}, Topology{Internal: true})
	s, err := Start("127.0.0.1:0", seed, Options{Async: true, AsyncPolls: 1, BusyRetryAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := s.URL() + "/subscriptions/sub/resourceGroups/RG/providers/Microsoft.Network/loadBalancers/"
	put := func(lb, pool string) *http.Response {
		b, _ := json.Marshal(s.Pool(lb, pool))
		req, _ := http.NewRequest(http.MethodPut, base+lb+"/backendAddressPools/"+pool, strings.NewReader(string(b)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Error struct {
				Code    string `json:"code"`
				Details []struct {
					Code string `json:"code"`
				} `json:"details"`
			} `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode == http.StatusTooManyRequests && (body.Error.Code != "RetryableError" || len(body.Error.Details) != 1 ||
			body.Error.Details[0].Code != "RetryableErrorDueToAnotherOperation" || resp.Header.Get("Retry-After") != "3") {
			t.Errorf("busy answer = %+v, Retry-After %q", body, resp.Header.Get("Retry-After"))
		}
		return resp
	}
	first := put("kubernetes", "kubernetes")
	if first.StatusCode != http.StatusCreated {
		t.Fatalf("first PUT = %d, want 201 (asynchronous)", first.StatusCode)
	}
	if code := put("kubernetes", "aksOutboundBackendPool").StatusCode; code != http.StatusTooManyRequests {
		t.Errorf("PUT to a sibling pool during the operation = %d, want 429", code)
	}
	if code := put("kubernetes-internal", "kubernetes").StatusCode; code != http.StatusCreated {
		t.Errorf("PUT to another load balancer = %d, want 201", code)
	}
	for status := ""; status != "Succeeded"; {
		resp, err := http.Get(first.Header.Get("Azure-AsyncOperation"))
		if err != nil {
			t.Fatal(err)
		}
		var op struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&op)
		resp.Body.Close()
		status = op.Status
	}
	if code := put("kubernetes", "aksOutboundBackendPool").StatusCode; code != http.StatusCreated {
		t.Errorf("PUT after the operation completed = %d, want 201", code)
	}

	end := s.BeginOperation("kubernetes-internal")
	// (The internal load balancer's own operation above is still unpolled:
	// BeginOperation replaces it, as a newer operation supersedes one in ARM.)
	if code := put("kubernetes-internal", "kubernetes").StatusCode; code != http.StatusTooManyRequests {
		t.Errorf("PUT during another writer's operation = %d, want 429", code)
	}
	end()
	if code := put("kubernetes-internal", "kubernetes").StatusCode; code != http.StatusCreated {
		t.Errorf("PUT after another writer's operation ended = %d, want 201", code)
	}
}
