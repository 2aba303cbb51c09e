package armclient

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// The load balancer reads (ListLoadBalancers, GetLoadBalancer) serve
// discovery and verification, which read each pool's entries and never
// write what they read back: a pool is written from its own GetPool. So
// they decode only what those read, into plain structs. The SDK's decoder
// builds a map of raw JSON per object for every entry of every pool; at
// 2,000 nodes a verification every 2 s of a fleet deletion made it most of
// nodeguard's allocation, and so of its peak memory.

// networkAPIVersion is the Microsoft.Network API version of the lean reads,
// the one armnetwork's own clients send.
const networkAPIVersion = "2025-05-01"

type leanLoadBalancerList struct {
	Value    []leanLoadBalancer `json:"value"`
	NextLink string             `json:"nextLink"`
}

type leanLoadBalancer struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Properties struct {
		BackendAddressPools []leanPool `json:"backendAddressPools"`
	} `json:"properties"`
}

type leanPool struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Properties struct {
		LoadBalancerBackendAddresses []leanAddress `json:"loadBalancerBackendAddresses"`
		BackendIPConfigurations      []leanRef     `json:"backendIPConfigurations"`
		// The rules say whether the pool serves only outbound traffic
		// (backends.OutboundOnly).
		LoadBalancingRules []leanRef `json:"loadBalancingRules"`
		InboundNatRules    []leanRef `json:"inboundNatRules"`
		OutboundRule       *leanRef  `json:"outboundRule"`
		OutboundRules      []leanRef `json:"outboundRules"`
	} `json:"properties"`
}

type leanAddress struct {
	Name       string `json:"name"`
	Properties struct {
		IPAddress                       string   `json:"ipAddress"`
		AdminState                      string   `json:"adminState"`
		NetworkInterfaceIPConfiguration *leanRef `json:"networkInterfaceIPConfiguration"`
	} `json:"properties"`
}

type leanRef struct {
	ID string `json:"id"`
}

func (c *sdkClient) ListLoadBalancers(ctx context.Context, resourceGroup string) ([]*armnetwork.LoadBalancer, error) {
	var out []*armnetwork.LoadBalancer
	next := c.loadBalancersURL(resourceGroup) + "?api-version=" + networkAPIVersion
	for next != "" {
		var page leanLoadBalancerList
		if err := c.getJSON(ctx, next, &page); err != nil {
			return nil, err
		}
		for i := range page.Value {
			out = append(out, page.Value[i].sdk())
		}
		next = page.NextLink
	}
	return out, nil
}

func (c *sdkClient) GetLoadBalancer(ctx context.Context, resourceGroup, name string) (*armnetwork.LoadBalancer, error) {
	var lb leanLoadBalancer
	err := c.getJSON(ctx, c.loadBalancersURL(resourceGroup)+"/"+url.PathEscape(name)+"?api-version="+networkAPIVersion, &lb)
	if err != nil {
		return nil, err
	}
	return lb.sdk(), nil
}

// loadBalancersURL is the resource group's load balancer collection.
func (c *sdkClient) loadBalancersURL(resourceGroup string) string {
	return c.endpoint + "/subscriptions/" + url.PathEscape(c.subscription) + "/resourceGroups/" + url.PathEscape(resourceGroup) +
		"/providers/Microsoft.Network/loadBalancers"
}

// getJSON GETs an ARM URL (a nextLink carries its own api-version) through
// the SDK pipeline (credential, retries, throttling gate) and decodes a 200
// into v; any other answer is an *azcore.ResponseError, as the SDK's.
func (c *sdkClient) getJSON(ctx context.Context, rawURL string, v any) error {
	resp, err := c.get(ctx, rawURL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if !runtime.HasStatusCode(resp, http.StatusOK) {
		return runtime.NewResponseError(resp)
	}
	// The pipeline has read the body already: decode those bytes, without
	// a decoder's buffer copying them again.
	if err := runtime.UnmarshalAsJSON(resp, v); err != nil {
		return fmt.Errorf("decoding GET %s: %w", resp.Request.URL.Path, err)
	}
	return nil
}

// sdk returns the load balancer as armnetwork's type, with what was read.
func (lb *leanLoadBalancer) sdk() *armnetwork.LoadBalancer {
	pools := make([]*armnetwork.BackendAddressPool, 0, len(lb.Properties.BackendAddressPools))
	for i := range lb.Properties.BackendAddressPools {
		pools = append(pools, lb.Properties.BackendAddressPools[i].sdk())
	}
	return &armnetwork.LoadBalancer{ID: str(lb.ID), Name: str(lb.Name),
		Properties: &armnetwork.LoadBalancerPropertiesFormat{BackendAddressPools: pools}}
}

func (p *leanPool) sdk() *armnetwork.BackendAddressPool {
	pr := &p.Properties
	out := &armnetwork.BackendAddressPoolPropertiesFormat{
		LoadBalancerBackendAddresses: make([]*armnetwork.LoadBalancerBackendAddress, 0, len(pr.LoadBalancerBackendAddresses)),
		BackendIPConfigurations:      make([]*armnetwork.InterfaceIPConfiguration, 0, len(pr.BackendIPConfigurations)),
		LoadBalancingRules:           subResources(pr.LoadBalancingRules),
		InboundNatRules:              subResources(pr.InboundNatRules),
		OutboundRules:                subResources(pr.OutboundRules),
	}
	if pr.OutboundRule != nil {
		out.OutboundRule = &armnetwork.SubResource{ID: str(pr.OutboundRule.ID)}
	}
	for i := range pr.LoadBalancerBackendAddresses {
		out.LoadBalancerBackendAddresses = append(out.LoadBalancerBackendAddresses, pr.LoadBalancerBackendAddresses[i].sdk())
	}
	for _, r := range pr.BackendIPConfigurations {
		out.BackendIPConfigurations = append(out.BackendIPConfigurations, &armnetwork.InterfaceIPConfiguration{ID: str(r.ID)})
	}
	return &armnetwork.BackendAddressPool{ID: str(p.ID), Name: str(p.Name), Properties: out}
}

func (a *leanAddress) sdk() *armnetwork.LoadBalancerBackendAddress {
	pr := &a.Properties
	out := &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: str(pr.IPAddress)}
	if pr.AdminState != "" {
		s := armnetwork.LoadBalancerBackendAddressAdminState(pr.AdminState)
		out.AdminState = &s
	}
	if pr.NetworkInterfaceIPConfiguration != nil {
		out.NetworkInterfaceIPConfiguration = &armnetwork.SubResource{ID: str(pr.NetworkInterfaceIPConfiguration.ID)}
	}
	return &armnetwork.LoadBalancerBackendAddress{Name: str(a.Name), Properties: out}
}

// subResources is nil for none, as the SDK decodes an absent list.
func subResources(refs []leanRef) []*armnetwork.SubResource {
	if refs == nil {
		return nil
	}
	out := make([]*armnetwork.SubResource, 0, len(refs))
	for _, r := range refs {
		out = append(out, &armnetwork.SubResource{ID: str(r.ID)})
	}
	return out
}

// str is nil for "", as the SDK decodes an absent string.
func str(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
