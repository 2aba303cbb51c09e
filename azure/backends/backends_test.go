package backends

import (
	"context"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
