package armemulator

import (
	"fmt"
	"net/netip"
	"strings"
)

// Node is a Kubernetes node as the emulator's topology helper sees it.
type Node struct {
	Name string
	// IPs are the node's InternalIPs (one per family).
	IPs []string
	// ProviderID is the node's spec.providerID (azure:///subscriptions/...).
	ProviderID string
}

// Topology says which load balancers SeedForNodes creates.
type Topology struct {
	// NICBased makes the public load balancer's main pool NIC-based (as
	// cloud-provider-azure does for VMSS and VMAS nodes); otherwise every pool
	// is IP-based.
	NICBased bool
	// Internal adds an internal load balancer "kubernetes-internal".
	Internal bool
	// MembersOnly, with NICBased, lists the NIC-based pool's members only in
	// its backendIPConfigurations, with no backend-address entries (the REST
	// specification's NIC pool example): no entry carries an admin state.
	MembersOnly bool
}

// SeedForNodes returns an AKS-like resource group holding nodes:
//
//   - load balancer "kubernetes" with pool "kubernetes" (IPv4), pool
//     "kubernetes-IPv6" when a node has an IPv6 address, and the outbound-only
//     pool "aksOutboundBackendPool";
//   - with Internal, load balancer "kubernetes-internal" with IP-based pool
//     "kubernetes" (and "kubernetes-IPv6").
//
// For NIC-based pools, VMSS uniform nodes get an IP configuration under their
// VM path, and standalone VMs (VMAS, VMSS flex) a NIC "<vm>-nic" in the
// resource group.
func SeedForNodes(subscription, resourceGroup string, nodes []Node, t Topology) Seed {
	seed := Seed{Subscription: subscription, ResourceGroup: resourceGroup}
	var v4, v6, nic, outbound, iv4, iv6 []EntrySeed
	for _, n := range nodes {
		for _, ip := range n.IPs {
			addr, err := netip.ParseAddr(ip)
			if err != nil {
				continue
			}
			e := EntrySeed{Name: n.Name, IP: ip}
			if addr.Is4() {
				v4 = append(v4, e)
				iv4 = append(iv4, e)
				outbound = append(outbound, e)
			} else {
				v6 = append(v6, e)
				iv6 = append(iv6, e)
			}
		}
		if t.NICBased {
			if cfg, iface := ipConfigFor(subscription, resourceGroup, n); cfg != "" {
				nic = append(nic, EntrySeed{Name: resourceGroup + "-" + n.Name, IPConfigID: cfg, MemberOnly: t.MembersOnly})
				if iface != nil {
					seed.Interfaces = append(seed.Interfaces, *iface)
				}
			}
		}
	}
	main := PoolSeed{Name: "kubernetes", Entries: v4}
	if t.NICBased {
		main.Entries = nic
	}
	pub := LoadBalancerSeed{Name: "kubernetes", Pools: []PoolSeed{main}}
	if len(v6) > 0 {
		pub.Pools = append(pub.Pools, PoolSeed{Name: "kubernetes-IPv6", Entries: v6})
	}
	pub.Pools = append(pub.Pools, PoolSeed{Name: "aksOutboundBackendPool", OutboundOnly: true, Entries: outbound})
	seed.LoadBalancers = append(seed.LoadBalancers, pub)
	if t.Internal {
		in := LoadBalancerSeed{Name: "kubernetes-internal", Pools: []PoolSeed{{Name: "kubernetes", Entries: iv4}}}
		if len(iv6) > 0 {
			in.Pools = append(in.Pools, PoolSeed{Name: "kubernetes-IPv6", Entries: iv6})
		}
		seed.LoadBalancers = append(seed.LoadBalancers, in)
	}
	return seed
}

// ipConfigFor returns the NIC IP configuration ID of a node, and the NIC to
// create for a standalone VM.
func ipConfigFor(subscription, resourceGroup string, n Node) (string, *NetworkInterfaceSeed) {
	vm := strings.TrimPrefix(n.ProviderID, "azure://")
	lower := strings.ToLower(vm)
	switch {
	case strings.Contains(lower, "/virtualmachinescalesets/") && strings.Contains(lower, "/virtualmachines/"):
		parts := strings.Split(vm, "/")
		// .../virtualMachineScaleSets/{ss}/virtualMachines/{id}
		ss := parts[len(parts)-3]
		return vm + "/networkInterfaces/" + ss + "/ipConfigurations/ipconfig1", nil
	case strings.Contains(lower, "/virtualmachines/"):
		parts := strings.Split(vm, "/")
		nicID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/networkInterfaces/%s-nic", subscription, resourceGroup, parts[len(parts)-1])
		return nicID + "/ipConfigurations/ipconfig1", &NetworkInterfaceSeed{ID: nicID, VirtualMachineID: vm}
	}
	return "", nil
}
