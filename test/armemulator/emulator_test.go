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
