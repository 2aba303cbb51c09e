// Package backends finds a node's entries in Azure load balancer backend
// pools: IP-based entries by InternalIP (or name), NIC-based entries through
// their IP configuration and the node's providerID (VMSS uniform by VM path;
// VMAS and VMSS flex through a NIC lookup). Resource IDs compare
// case-insensitively, since cloud-provider-azure lowercases resource groups.
package backends

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// OutboundPoolName is the pool AKS uses for outbound rules only.
const OutboundPoolName = "aksOutboundBackendPool"

// Node is what identifies a node's backend entries.
type Node struct {
	// Key identifies the node to the caller (its UID).
	Key string
	// Name matches an IP-based entry's name when the node has no InternalIP.
	Name string
	// IPs are the node's InternalIPs, any family.
	IPs []netip.Addr
	// ProviderID is spec.providerID (azure:///subscriptions/...).
	ProviderID string
}

// FromNode reads the identifying fields of a Kubernetes node.
func FromNode(n *corev1.Node) Node {
	out := Node{Key: string(n.UID), Name: n.Name, ProviderID: n.Spec.ProviderID}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out.IPs = append(out.IPs, ip.Unmap())
		}
	}
	return out
}

// VMPath returns the lowercased VM resource ID of a providerID
// ("/subscriptions/.../virtualmachines/x"), or "" when it is not an Azure VM.
func VMPath(providerID string) string {
	p := strings.ToLower(strings.TrimSpace(providerID))
	if !strings.HasPrefix(p, "azure://") {
		return ""
	}
	p = strings.TrimPrefix(p, "azure://")
	if !strings.HasPrefix(p, "/subscriptions/") || !strings.Contains(p, "/virtualmachines/") {
		return ""
	}
	return strings.TrimRight(p, "/")
}

// NICResolver tells which VM a NIC is attached to.
type NICResolver interface {
	// VirtualMachineID returns the resource ID of the NIC's VM, "" when the
	// NIC is gone or attached to none.
	VirtualMachineID(ctx context.Context, nicID string) (string, error)
}

// Index finds nodes by InternalIP, name and VM.
type Index struct {
	byIP      map[netip.Addr]string
	byName    map[string]string // only nodes without an InternalIP
	byVM      map[string]string
	nodeCount int
}

// NewIndex indexes nodes.
func NewIndex(nodes []Node) *Index {
	ix := &Index{byIP: map[netip.Addr]string{}, byName: map[string]string{}, byVM: map[string]string{}, nodeCount: len(nodes)}
	for _, n := range nodes {
		for _, ip := range n.IPs {
			ix.byIP[ip.Unmap()] = n.Key
		}
		if len(n.IPs) == 0 && n.Name != "" {
			ix.byName[strings.ToLower(n.Name)] = n.Key
		}
		if vm := VMPath(n.ProviderID); vm != "" {
			ix.byVM[vm] = n.Key
		}
	}
	return ix
}

// Len is the number of nodes indexed.
func (ix *Index) Len() int { return ix.nodeCount }

// OutboundOnly reports whether a pool serves only outbound rules (such pools
// carry no inbound traffic, so admin state is pointless there).
func OutboundOnly(p *armnetwork.BackendAddressPool) bool {
	if p == nil {
		return true
	}
	if p.Name != nil && strings.EqualFold(*p.Name, OutboundPoolName) {
		return true
	}
	pr := p.Properties
	if pr == nil {
		return false
	}
	hasOutbound := pr.OutboundRule != nil || len(pr.OutboundRules) > 0
	return hasOutbound && len(pr.LoadBalancingRules) == 0 && len(pr.InboundNatRules) == 0
}

// Match returns, for each entry of the pool's LoadBalancerBackendAddresses
// (same order), the key of the node it belongs to, or "".
func (ix *Index) Match(ctx context.Context, p *armnetwork.BackendAddressPool, nics NICResolver) ([]string, error) {
	if p == nil || p.Properties == nil {
		return nil, nil
	}
	out := make([]string, len(p.Properties.LoadBalancerBackendAddresses))
	for i, e := range p.Properties.LoadBalancerBackendAddresses {
		k, err := ix.matchEntry(ctx, e, nics)
		if err != nil {
			return nil, err
		}
		out[i] = k
	}
	return out, nil
}

// Members returns the keys of the nodes with an entry in the pool, including
// those only listed in its BackendIPConfigurations.
func (ix *Index) Members(ctx context.Context, p *armnetwork.BackendAddressPool, nics NICResolver) (map[string]bool, error) {
	keys, err := ix.Match(ctx, p, nics)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, k := range keys {
		if k != "" {
			out[k] = true
		}
	}
	if p != nil && p.Properties != nil {
		for _, c := range p.Properties.BackendIPConfigurations {
			if c == nil || c.ID == nil {
				continue
			}
			k, err := ix.matchIPConfig(ctx, *c.ID, nics)
			if err != nil {
				return nil, err
			}
			if k != "" {
				out[k] = true
			}
		}
	}
	return out, nil
}

// WithoutEntry returns the keys of the nodes the pool lists in its
// BackendIPConfigurations that no entry matched (keys is Match's answer):
// members with nothing to carry an admin state.
func (ix *Index) WithoutEntry(ctx context.Context, p *armnetwork.BackendAddressPool, keys []string, nics NICResolver) (map[string]bool, error) {
	out := map[string]bool{}
	if p == nil || p.Properties == nil || len(p.Properties.BackendIPConfigurations) == 0 {
		return out, nil
	}
	entered := make(map[string]bool, len(keys))
	for _, k := range keys {
		entered[k] = true
	}
	for _, c := range p.Properties.BackendIPConfigurations {
		if c == nil || c.ID == nil {
			continue
		}
		k, err := ix.matchIPConfig(ctx, *c.ID, nics)
		if err != nil {
			return nil, err
		}
		if k != "" && !entered[k] {
			out[k] = true
		}
	}
	return out, nil
}

func (ix *Index) matchEntry(ctx context.Context, e *armnetwork.LoadBalancerBackendAddress, nics NICResolver) (string, error) {
	if e == nil || e.Properties == nil {
		return "", nil
	}
	if e.Properties.IPAddress != nil && *e.Properties.IPAddress != "" {
		ip, err := netip.ParseAddr(*e.Properties.IPAddress)
		if err != nil {
			return "", nil
		}
		if k, ok := ix.byIP[ip.Unmap()]; ok {
			return k, nil
		}
		// An entry whose IP is known to no node: the name counts only for a
		// node whose InternalIPs are not known yet.
		if e.Name != nil {
			return ix.byName[strings.ToLower(*e.Name)], nil
		}
		return "", nil
	}
	if c := e.Properties.NetworkInterfaceIPConfiguration; c != nil && c.ID != nil && *c.ID != "" {
		return ix.matchIPConfig(ctx, *c.ID, nics)
	}
	return "", nil
}

// matchIPConfig maps a NIC IP configuration ID to a node. VMSS uniform IDs
// carry the VM path; others name a standalone NIC, which is looked up.
func (ix *Index) matchIPConfig(ctx context.Context, id string, nics NICResolver) (string, error) {
	lower := strings.ToLower(id)
	i := strings.Index(lower, "/networkinterfaces/")
	if i < 0 {
		return "", nil
	}
	prefix := lower[:i]
	if strings.Contains(prefix, "/virtualmachinescalesets/") {
		return ix.byVM[prefix], nil
	}
	nicID := id
	if j := strings.Index(lower, "/ipconfigurations/"); j >= 0 {
		nicID = id[:j]
	}
	if nics == nil || len(ix.byVM) == 0 {
		return "", nil
	}
	vm, err := nics.VirtualMachineID(ctx, nicID)
	if err != nil {
		return "", fmt.Errorf("looking up NIC %s: %w", nicID, err)
	}
	return ix.byVM[strings.TrimRight(strings.ToLower(vm), "/")], nil
}

// NICCache resolves NICs with a GET and remembers each answer for a while.
// A NIC can be detached from its VM and attached to another (a VMAS or VMSS
// flex VM rebuilt around its NIC), so no answer is kept for good: one naming
// a VM lives attachedTTL, and "attached to none" or "gone" (404), which a VM
// may take up at any moment, only detachedTTL.
type NICCache struct {
	get         func(ctx context.Context, id string) (*armnetwork.Interface, error)
	clock       clock.PassiveClock
	attachedTTL time.Duration
	detachedTTL time.Duration

	mu      sync.Mutex
	answers map[string]nicAnswer // by lower(NIC ID)
	// nextSweep is when expired answers are next dropped, so that NICs no
	// longer asked about do not pile up.
	nextSweep time.Time
}

type nicAnswer struct {
	vm      string
	expires time.Time
}

// NewNICCache returns a cache over get whose answers expire on clk: after
// attachedTTL for a NIC attached to a VM, after detachedTTL for one attached
// to none or gone. A TTL of zero or less keeps no such answer.
func NewNICCache(get func(ctx context.Context, id string) (*armnetwork.Interface, error), clk clock.PassiveClock, attachedTTL, detachedTTL time.Duration) *NICCache {
	return &NICCache{get: get, clock: clk, attachedTTL: attachedTTL, detachedTTL: detachedTTL, answers: map[string]nicAnswer{}}
}

// VirtualMachineID implements NICResolver. A NIC that is gone (404) has no VM.
func (c *NICCache) VirtualMachineID(ctx context.Context, nicID string) (string, error) {
	k := strings.ToLower(nicID)
	c.mu.Lock()
	a, ok := c.answers[k]
	c.mu.Unlock()
	if ok && c.clock.Now().Before(a.expires) {
		return a.vm, nil
	}
	nic, err := c.get(ctx, nicID)
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		c.remember(k, "")
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var vm string
	if nic.Properties != nil && nic.Properties.VirtualMachine != nil && nic.Properties.VirtualMachine.ID != nil {
		vm = *nic.Properties.VirtualMachine.ID
	}
	c.remember(k, vm)
	return vm, nil
}

// remember stores an answer with its expiry, and drops expired ones now and
// then.
func (c *NICCache) remember(k, vm string) {
	ttl := c.attachedTTL
	if vm == "" {
		ttl = c.detachedTTL
	}
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(c.nextSweep) {
		for key, a := range c.answers {
			if !now.Before(a.expires) {
				delete(c.answers, key)
			}
		}
		c.nextSweep = now.Add(max(c.attachedTTL, c.detachedTTL))
	}
	if ttl <= 0 {
		delete(c.answers, k)
		return
	}
	c.answers[k] = nicAnswer{vm: vm, expires: now.Add(ttl)}
}

// Len is the number of NIC answers still valid.
func (c *NICCache) Len() int {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.answers {
		if now.Before(a.expires) {
			n++
		}
	}
	return n
}
