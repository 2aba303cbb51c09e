package armclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/azure/backends"
	"github.com/nodeguard/nodeguard/test/armemulator"
)

// TestLoadBalancerReadsMatchTheSDK: the lean reads see what armnetwork's own
// decoder sees of every field discovery and verification read, on each pool
// shape the emulator plays (IP-based, NIC-based with entries, NIC members
// only, the outbound-only pool, IPv6, an entry Down).
func TestLoadBalancerReadsMatchTheSDK(t *testing.T) {
	ctx := context.Background()
	vmss := "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool0/virtualMachines/3"
	nodes := []armemulator.Node{
		{Name: "n0", IPs: []string{"10.0.0.4", "fd00::4"}},
		{Name: "pool0000003", IPs: []string{"10.0.0.5"}, ProviderID: "azure://" + vmss},
	}
	for _, topo := range []armemulator.Topology{{}, {NICBased: true, Internal: true}, {NICBased: true, MembersOnly: true}} {
		t.Run(fmt.Sprintf("%+v", topo), func(t *testing.T) {
			emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes("sub", "rg", nodes, topo), armemulator.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = emu.Close() })
			c := newClientAt(t, emu.URL())
			if p, err := c.GetPool(ctx, "rg", "kubernetes", "kubernetes"); err == nil && len(p.Properties.LoadBalancerBackendAddresses) > 0 {
				p.Properties.LoadBalancerBackendAddresses[0].Properties.AdminState = ptr.To(armnetwork.LoadBalancerBackendAddressAdminStateDown)
				if _, err := c.UpdatePool(ctx, "rg", "kubernetes", p); err != nil {
					t.Fatal(err)
				}
			}
			sdk := sdkLoadBalancers(t, emu.URL())

			lean, err := c.ListLoadBalancers(ctx, "rg")
			if err != nil {
				t.Fatal(err)
			}
			want, got := readView(sdk), readView(lean)
			if !slices.Equal(got, want) {
				t.Errorf("lean list reads\n%s\nthe SDK reads\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if !slices.ContainsFunc(want, func(l string) bool { return strings.Contains(l, "admin=Down") }) && !topo.MembersOnly {
				t.Errorf("no entry Down in\n%s", strings.Join(want, "\n"))
			}
			one, err := c.GetLoadBalancer(ctx, "rg", "kubernetes")
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(sdk, func(lb *armnetwork.LoadBalancer) bool { return *lb.Name == "kubernetes" })
			if got, want := readView([]*armnetwork.LoadBalancer{one}), readView(sdk[i:i+1]); !slices.Equal(got, want) {
				t.Errorf("lean get reads\n%s\nthe SDK reads\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// sdkLoadBalancers lists the load balancers with armnetwork's own client.
func sdkLoadBalancers(t *testing.T, url string) []*armnetwork.LoadBalancer {
	t.Helper()
	lbs, err := armnetwork.NewLoadBalancersClient("sub", staticToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud:                           cloud.Configuration{Services: map[cloud.ServiceName]cloud.ServiceConfiguration{cloud.ResourceManager: {Endpoint: url, Audience: url}}},
		InsecureAllowCredentialWithHTTP: true,
	}, DisableRPRegistration: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []*armnetwork.LoadBalancer
	for pager := lbs.NewListPager("rg", nil); pager.More(); {
		page, err := pager.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Value...)
	}
	return out
}

// readView lists what discovery and verification read of the load
// balancers, a line per pool, entry and member.
func readView(lbs []*armnetwork.LoadBalancer) []string {
	var out []string
	s := func(p *string) string { return ptr.Deref(p, "<nil>") }
	for _, lb := range lbs {
		for _, p := range lb.Properties.BackendAddressPools {
			key := s(lb.Name) + "/" + s(p.Name)
			out = append(out, fmt.Sprintf("%s id=%s outboundOnly=%v", key, s(p.ID), backends.OutboundOnly(p)))
			if p.Properties == nil {
				continue
			}
			for _, e := range p.Properties.LoadBalancerBackendAddresses {
				pr := e.Properties
				nic := "<nil>"
				if pr.NetworkInterfaceIPConfiguration != nil {
					nic = s(pr.NetworkInterfaceIPConfiguration.ID)
				}
				out = append(out, fmt.Sprintf("%s entry name=%s ip=%s admin=%s nic=%s", key, s(e.Name), s(pr.IPAddress), ptr.Deref(pr.AdminState, "<nil>"), nic))
			}
			for _, m := range p.Properties.BackendIPConfigurations {
				out = append(out, fmt.Sprintf("%s member %s", key, s(m.ID)))
			}
		}
	}
	return out
}

// pagedARM answers the load balancer list in two pages, the first with a
// nextLink as ARM writes it, and a 404 with ARM's error body for any other
// path.
type pagedARM struct{ paths []string }

func (a *pagedARM) Do(req *http.Request) (*http.Response, error) {
	a.paths = append(a.paths, req.URL.Path+"?"+req.URL.RawQuery)
	status, body := http.StatusNotFound, `{"error":{"code":"ResourceGroupNotFound","message":"Resource group 'gone' could not be found."}}`
	lb := func(name string) string {
		return `{"name":"` + name + `","id":"/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/` + name + `","properties":{"frontendIPConfigurations":[{"name":"fe"}],` +
			`"backendAddressPools":[{"name":"kubernetes","properties":{"loadBalancingRules":[{"id":"r"}],"loadBalancerBackendAddresses":[{"name":"n0","properties":{"ipAddress":"10.0.0.4","adminState":"Down","inboundNatRulesPortMapping":[]}}]}}]}}`
	}
	switch {
	case strings.HasSuffix(req.URL.Path, "/resourceGroups/rg/providers/Microsoft.Network/loadBalancers") && req.URL.Query().Get("$skiptoken") == "":
		status, body = http.StatusOK, `{"value":[`+lb("a")+`],"nextLink":"https://arm.example/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers?api-version=2025-05-01&$skiptoken=2"}`
	case req.URL.Query().Get("$skiptoken") == "2":
		status, body = http.StatusOK, `{"value":[`+lb("b")+`]}`
	}
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
}

// TestLoadBalancerListFollowsNextLink: a list ARM pages is read to its last
// page, and a 404 keeps ARM's error code (discovery reads
// ResourceGroupNotFound from it).
func TestLoadBalancerListFollowsNextLink(t *testing.T) {
	arm := &pagedARM{}
	c, err := New(Settings{
		SubscriptionID: "sub", Credential: staticToken{}, Clock: testingclock.NewFakeClock(time.Now()), Transport: arm,
		Cloud: cloud.Configuration{ActiveDirectoryAuthorityHost: "https://login.example/", Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: "https://arm.example", Audience: "https://arm.example"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	lbs, err := c.ListLoadBalancers(context.Background(), "rg")
	if err != nil {
		t.Fatal(err)
	}
	got := readView(lbs)
	want := []string{
		"a/kubernetes id=<nil> outboundOnly=false", "a/kubernetes entry name=n0 ip=10.0.0.4 admin=Down nic=<nil>",
		"b/kubernetes id=<nil> outboundOnly=false", "b/kubernetes entry name=n0 ip=10.0.0.4 admin=Down nic=<nil>",
	}
	if !slices.Equal(got, want) {
		t.Errorf("read\n%s\nwant\n%s\n(requests %v)", strings.Join(got, "\n"), strings.Join(want, "\n"), arm.paths)
	}
	if len(arm.paths) != 2 || !strings.Contains(arm.paths[0], "api-version="+networkAPIVersion) {
		t.Errorf("requests %v, want the list with api-version %s, then its nextLink", arm.paths, networkAPIVersion)
	}
	_, err = c.ListLoadBalancers(context.Background(), "gone")
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusNotFound || re.ErrorCode != "ResourceGroupNotFound" {
		t.Errorf("list of a missing resource group: %v, want a 404 ResponseError with code ResourceGroupNotFound", err)
	}
}
