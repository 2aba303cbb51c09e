package backends

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/test/armemulator"
)

const (
	rg  = "/subscriptions/0000/resourceGroups/mc_rg_cluster_westeurope"
	rgL = "/subscriptions/0000/resourcegroups/MC_RG_CLUSTER_WESTEUROPE" // cloud-provider-azure casing varies
)

var nodes = []Node{
	{Key: "uid-a", Name: "aks-nodepool1-12345678-vmss000000", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.4"), netip.MustParseAddr("fd00::4")},
		ProviderID: "azure://" + rgL + "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-12345678-vmss/virtualMachines/0"},
	{Key: "uid-b", Name: "aks-nodepool1-12345678-vmss000001", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.5"), netip.MustParseAddr("fd00::5")},
		ProviderID: "azure://" + rg + "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-12345678-vmss/virtualMachines/1"},
	{Key: "uid-vm", Name: "aks-agentpool-vm-0", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.10")},
		ProviderID: "azure://" + rg + "/providers/Microsoft.Compute/virtualMachines/aks-agentpool-vm-0"},
	{Key: "uid-flex", Name: "aks-flex-00000a", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.11")},
		ProviderID: "azure://" + rg + "/providers/Microsoft.Compute/virtualMachines/aks-flex-00000a"},
	{Key: "uid-noip", Name: "fresh-node"},
}

// nics maps NIC IDs (any case) to VM IDs, as a NIC GET would.
type fakeNICs map[string]string

func (f fakeNICs) VirtualMachineID(_ context.Context, id string) (string, error) {
	for k, v := range f {
		if equalFold(k, id) {
			return v, nil
		}
	}
	return "", nil
}

func equalFold(a, b string) bool {
	return len(a) == len(b) && (a == b || lower(a) == lower(b))
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 32
		}
	}
	return string(b)
}

func pool(t *testing.T, js string) *armnetwork.BackendAddressPool {
	t.Helper()
	var p armnetwork.BackendAddressPool
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatalf("bad test JSON: %v", err)
	}
	return &p
}

func TestMatch(t *testing.T) {
	nics := fakeNICs{
		rg + "/providers/Microsoft.Network/networkInterfaces/aks-agentpool-vm-0-nic": rg + "/providers/Microsoft.Compute/virtualMachines/aks-agentpool-vm-0",
		rg + "/providers/Microsoft.Network/networkInterfaces/aks-flex-00000a-nic":    rgL + "/providers/Microsoft.Compute/virtualMachines/AKS-FLEX-00000A",
	}
	tests := []struct {
		name        string
		pool        string
		wantMatch   []string
		wantMembers []string
		wantSkip    bool
	}{{
		name: "IP-based IPv4 pool of the public LB",
		pool: `{"name":"kubernetes","id":"` + rg + `/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes",
		  "etag":"W/\"1\"","properties":{"loadBalancingRules":[{"id":"x"}],"loadBalancerBackendAddresses":[
		   {"name":"aks-nodepool1-12345678-vmss000000","properties":{"ipAddress":"10.224.0.4","virtualNetwork":{"id":"v"}}},
		   {"name":"aks-nodepool1-12345678-vmss000001","properties":{"ipAddress":"10.224.0.5","adminState":"Down"}},
		   {"name":"gone-node","properties":{"ipAddress":"10.224.0.99"}}]}}`,
		wantMatch:   []string{"uid-a", "uid-b", ""},
		wantMembers: []string{"uid-a", "uid-b"},
	}, {
		name: "IPv6 pool <cluster>-IPv6",
		pool: `{"name":"kubernetes-IPv6","properties":{"loadBalancingRules":[{"id":"x"}],"loadBalancerBackendAddresses":[
		   {"name":"aks-nodepool1-12345678-vmss000000","properties":{"ipAddress":"fd00:0:0:0:0:0:0:4"}},
		   {"name":"aks-nodepool1-12345678-vmss000001","properties":{"ipAddress":"fd00::5"}}]}}`,
		wantMatch:   []string{"uid-a", "uid-b"},
		wantMembers: []string{"uid-a", "uid-b"},
	}, {
		name: "name matches only a node without known InternalIP",
		pool: `{"name":"kubernetes","properties":{"loadBalancerBackendAddresses":[
		   {"name":"fresh-node","properties":{"ipAddress":"10.224.0.200"}},
		   {"name":"aks-nodepool1-12345678-vmss000000","properties":{"ipAddress":"10.224.0.201"}}]}}`,
		wantMatch:   []string{"uid-noip", ""},
		wantMembers: []string{"uid-noip"},
	}, {
		name: "NIC-based VMSS uniform pool, mixed-case resource groups",
		pool: `{"name":"kubernetes","properties":{"loadBalancingRules":[{"id":"x"}],
		  "backendIPConfigurations":[
		   {"id":"` + rg + `/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-12345678-vmss/virtualMachines/0/networkInterfaces/aks-nodepool1-12345678-vmss/ipConfigurations/ipconfig1"},
		   {"id":"` + rgL + `/providers/Microsoft.Compute/virtualMachineScaleSets/AKS-NODEPOOL1-12345678-VMSS/virtualMachines/1/networkInterfaces/aks-nodepool1-12345678-vmss/ipConfigurations/ipconfig1"}],
		  "loadBalancerBackendAddresses":[
		   {"name":"mc_rg-aks-nodepool1-0","properties":{"networkInterfaceIPConfiguration":{"id":"` + rg + `/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-12345678-vmss/virtualMachines/0/networkInterfaces/aks-nodepool1-12345678-vmss/ipConfigurations/ipconfig1"}}},
		   {"name":"mc_rg-aks-nodepool1-1","properties":{"networkInterfaceIPConfiguration":{"id":"` + rgL + `/providers/Microsoft.Compute/virtualMachineScaleSets/AKS-NODEPOOL1-12345678-VMSS/virtualMachines/1/networkInterfaces/aks-nodepool1-12345678-vmss/ipConfigurations/ipconfig1"}}}]}}`,
		wantMatch:   []string{"uid-a", "uid-b"},
		wantMembers: []string{"uid-a", "uid-b"},
	}, {
		name: "NIC-based VMAS and VMSS flex pool through NIC lookup",
		pool: `{"name":"kubernetes","properties":{"loadBalancingRules":[{"id":"x"}],
		  "backendIPConfigurations":[
		   {"id":"` + rg + `/providers/Microsoft.Network/networkInterfaces/aks-agentpool-vm-0-nic/ipConfigurations/ipconfig1"},
		   {"id":"` + rg + `/providers/Microsoft.Network/networkInterfaces/aks-flex-00000a-nic/ipConfigurations/ipconfig1"},
		   {"id":"` + rg + `/providers/Microsoft.Network/networkInterfaces/unknown-nic/ipConfigurations/ipconfig1"}],
		  "loadBalancerBackendAddresses":[
		   {"name":"e1","properties":{"networkInterfaceIPConfiguration":{"id":"` + rg + `/providers/Microsoft.Network/networkInterfaces/aks-agentpool-vm-0-nic/ipConfigurations/ipconfig1"}}},
		   {"name":"e3","properties":{"networkInterfaceIPConfiguration":{"id":"` + rg + `/providers/Microsoft.Network/networkInterfaces/unknown-nic/ipConfigurations/ipconfig1"}}}]}}`,
		wantMatch:   []string{"uid-vm", ""},
		wantMembers: []string{"uid-flex", "uid-vm"},
	}, {
		name: "internal LB pool",
		pool: `{"name":"kubernetes","id":"` + rg + `/providers/Microsoft.Network/loadBalancers/kubernetes-internal/backendAddressPools/kubernetes",
		  "properties":{"loadBalancingRules":[{"id":"x"}],"loadBalancerBackendAddresses":[
		   {"name":"aks-agentpool-vm-0","properties":{"ipAddress":"10.224.0.10"}}]}}`,
		wantMatch:   []string{"uid-vm"},
		wantMembers: []string{"uid-vm"},
	}, {
		name: "outbound-only pool by name",
		pool: `{"name":"aksOutboundBackendPool","properties":{"outboundRules":[{"id":"o"}],"loadBalancerBackendAddresses":[
		   {"name":"aks-agentpool-vm-0","properties":{"ipAddress":"10.224.0.10"}}]}}`,
		wantMatch: []string{"uid-vm"}, wantMembers: []string{"uid-vm"}, wantSkip: true,
	}, {
		name:      "outbound-only pool by rules",
		pool:      `{"name":"egress","properties":{"outboundRule":{"id":"o"},"loadBalancerBackendAddresses":[]}}`,
		wantMatch: []string{}, wantSkip: true,
	}, {
		name: "pool shared by outbound and load-balancing rules is not skipped",
		pool: `{"name":"kubernetes","properties":{"outboundRules":[{"id":"o"}],"loadBalancingRules":[{"id":"x"}]}}`,
	}}
	ix := NewIndex(nodes)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pool(t, tt.pool)
			got, err := ix.Match(context.Background(), p, nics)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantMatch == nil {
				tt.wantMatch = []string{}
			}
			if got == nil {
				got = []string{}
			}
			if !reflect.DeepEqual(got, tt.wantMatch) {
				t.Errorf("Match = %q, want %q", got, tt.wantMatch)
			}
			members, err := ix.Members(context.Background(), p, nics)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, k := range []string{"uid-a", "uid-b", "uid-flex", "uid-noip", "uid-vm"} {
				if members[k] {
					keys = append(keys, k)
				}
			}
			if len(keys) != len(members) {
				t.Errorf("unexpected members %v", members)
			}
			if !reflect.DeepEqual(keys, tt.wantMembers) {
				t.Errorf("Members = %q, want %q", keys, tt.wantMembers)
			}
			if got := OutboundOnly(p); got != tt.wantSkip {
				t.Errorf("OutboundOnly = %v, want %v", got, tt.wantSkip)
			}
		})
	}
}

func TestFromNodeAndVMPath(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1"},
		Spec:       corev1.NodeSpec{ProviderID: "azure:///subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/VM1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeInternalIP, Address: "10.0.0.1"},
			{Type: corev1.NodeExternalIP, Address: "20.0.0.1"},
			{Type: corev1.NodeInternalIP, Address: "fd00::1"},
		}},
	}
	got := FromNode(n)
	want := Node{Key: "u1", Name: "n1", ProviderID: n.Spec.ProviderID, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FromNode = %+v, want %+v", got, want)
	}
	for in, want := range map[string]string{
		n.Spec.ProviderID:  "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm1",
		"kind://docker/n1": "",
		"":                 "",
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3": "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/ss/virtualmachines/3",
	} {
		if got := VMPath(in); got != want {
			t.Errorf("VMPath(%q) = %q, want %q", in, got, want)
		}
	}
}

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "t", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// TestNICCacheRevalidates: a NIC answer is served from the cache until it
// expires, then read again from ARM, so a NIC re-attached to another VM, or
// detached, or deleted, changes owner: an attached answer after the long TTL,
// "attached to none" and 404 after the short one.
func TestNICCacheRevalidates(t *testing.T) {
	const (
		sub         = "0000"
		group       = "MC_rg_cluster_westeurope"
		attachedTTL = 5 * time.Minute
		detachedTTL = 5 * time.Second
	)
	vmID := func(name string) string {
		return "/subscriptions/" + sub + "/resourceGroups/" + group + "/providers/Microsoft.Compute/virtualMachines/" + name
	}
	nicID := "/subscriptions/" + sub + "/resourceGroups/" + group + "/providers/Microsoft.Network/networkInterfaces/flex-nic"
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.Seed{Subscription: sub, ResourceGroup: group,
		Interfaces: []armemulator.NetworkInterfaceSeed{{ID: nicID, VirtualMachineID: vmID("vm-a")}}}, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	client, err := armclient.New(armclient.Settings{
		SubscriptionID: sub, Credential: staticToken{}, InsecureAllowHTTP: true,
		Cloud: cloud.Configuration{ActiveDirectoryAuthorityHost: "https://login.example/", Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: emu.URL(), Audience: emu.URL()},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakeClock(time.Now())
	cache := NewNICCache(client.GetInterface, clk, attachedTTL, detachedTTL)

	// The pool lists the NIC's IP configuration; the nodes are the VMs it
	// can be attached to.
	ix := NewIndex([]Node{
		{Key: "uid-a", Name: "vm-a", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.4")}, ProviderID: "azure://" + vmID("vm-a")},
		{Key: "uid-b", Name: "vm-b", IPs: []netip.Addr{netip.MustParseAddr("10.224.0.5")}, ProviderID: "azure://" + vmID("vm-b")},
	})
	p := pool(t, `{"name":"kubernetes","properties":{"loadBalancingRules":[{"id":"x"}],
	  "backendIPConfigurations":[{"id":"`+nicID+`/ipConfigurations/ipconfig1"}],
	  "loadBalancerBackendAddresses":[{"name":"e1","properties":{"networkInterfaceIPConfiguration":{"id":"`+nicID+`/ipConfigurations/ipconfig1"}}}]}}`)

	nicGets := func() int { return emu.Count(http.MethodGet, "/networkInterfaces/") }
	// check looks the NIC up through the index and wants the node that owns
	// it (or none), and the number of NIC GETs so far.
	check := func(step, wantOwner string, wantGets int) {
		t.Helper()
		keys, err := ix.Match(context.Background(), p, cache)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if keys[0] != wantOwner {
			t.Errorf("%s: entry belongs to %q, want %q", step, keys[0], wantOwner)
		}
		if got := nicGets(); got != wantGets {
			t.Errorf("%s: %d NIC GETs, want %d", step, got, wantGets)
		}
	}

	check("first lookup", "uid-a", 1)
	emu.SetInterfaceVM(nicID, vmID("vm-b"))
	check("re-attached, attached answer still valid", "uid-a", 1)
	clk.Step(attachedTTL - time.Second)
	check("re-attached, just before the attached TTL", "uid-a", 1)
	clk.Step(time.Second)
	check("re-attached, at the attached TTL", "uid-b", 2)

	emu.SetInterfaceVM(nicID, "")
	clk.Step(attachedTTL)
	check("detached", "", 3)
	emu.SetInterfaceVM(nicID, vmID("vm-a"))
	clk.Step(detachedTTL - time.Second)
	check("attached again, detached answer still valid", "", 3)
	clk.Step(time.Second)
	check("attached again, at the detached TTL", "uid-a", 4)

	emu.DeleteInterface(nicID)
	clk.Step(attachedTTL)
	check("deleted (404)", "", 5)
	clk.Step(detachedTTL - time.Second)
	check("deleted, 404 answer still valid", "", 5)
	emu.SetInterfaceVM(nicID, vmID("vm-b"))
	clk.Step(time.Second)
	check("created again, at the detached TTL", "uid-b", 6)
	if got := cache.Len(); got != 1 {
		t.Errorf("cache holds %d valid answers, want 1", got)
	}
}
