// Package armemulator is an HTTP server that speaks the Azure Resource Manager
// wire format for the network resources nodeguard touches: load balancers,
// their backend address pools, and network interfaces, in one subscription and
// resource group, and, read only, the VMs and an AKS managed cluster's agent
// pools with their upgrade settings (aks.go). The real Azure SDK client talks
// to it over HTTP exactly as to Azure (a custom cloud endpoint,
// InsecureAllowCredentialWithHTTP, DisableRPRegistration).
//
// It plays ARM's ETag rule: a load balancer has one ETag, which every one of
// its backend pools reports, and a write to any pool bumps it (a pool is a
// child resource); If-Match with another ETag is answered with 412. A
// NIC-based pool can list members only in backendIPConfigurations, with no
// backend-address entry (as the REST specification's example does), and a
// PUT cannot add NIC-based entries: networkInterfaceIPConfiguration is
// read-only in the specification, so such entries are ignored. Writes can be
// throttled per subscription (ARM's write budget). It can run writes as asynchronous operations (Azure-AsyncOperation
// plus status polling), injects faults per path (any status with Retry-After,
// added latency, hanging until the client gives up, a failed long-running
// operation, or a hook that runs before the request, e.g. a concurrent writer),
// and records every request for assertions.
package armemulator

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// APIVersion is the api-version the emulator reports; it accepts any.
const APIVersion = "2025-05-01"

// Seed is the initial content of the emulated resource group.
type Seed struct {
	Subscription  string                 `json:"subscription"`
	ResourceGroup string                 `json:"resourceGroup"`
	Location      string                 `json:"location,omitempty"`
	LoadBalancers []LoadBalancerSeed     `json:"loadBalancers"`
	Interfaces    []NetworkInterfaceSeed `json:"interfaces,omitempty"`
	// VMs are the resource IDs of the VMs that exist (standalone VMs and
	// VMSS instances); SeedForNodes lists each node's.
	VMs []string `json:"vms,omitempty"`
	// ManagedCluster is the AKS cluster whose agent pools are served (aks.go).
	ManagedCluster *ManagedClusterSeed `json:"managedCluster,omitempty"`
}

// LoadBalancerSeed is one load balancer.
type LoadBalancerSeed struct {
	Name  string     `json:"name"`
	Pools []PoolSeed `json:"pools"`
}

// PoolSeed is one backend address pool.
type PoolSeed struct {
	Name string `json:"name"`
	// OutboundOnly makes the pool referenced by an outbound rule and by no
	// load-balancing rule (like AKS's aksOutboundBackendPool).
	OutboundOnly bool        `json:"outboundOnly,omitempty"`
	Entries      []EntrySeed `json:"entries,omitempty"`
}

// EntrySeed is one backend address: IP-based (IP set) or NIC-based (IPConfigID
// set, the full resource ID of a NIC IP configuration).
type EntrySeed struct {
	Name       string `json:"name"`
	IP         string `json:"ip,omitempty"`
	IPConfigID string `json:"ipConfigId,omitempty"`
	AdminState string `json:"adminState,omitempty"`
	// MemberOnly lists a NIC-based member only in the pool's
	// backendIPConfigurations, with no backend-address entry to carry an
	// admin state (the REST specification's NIC pool example).
	MemberOnly bool `json:"memberOnly,omitempty"`
}

// NetworkInterfaceSeed is a standalone NIC (VMAS or VMSS flex) attached to a VM.
type NetworkInterfaceSeed struct {
	// ID is the NIC's full resource ID.
	ID string `json:"id"`
	// VirtualMachineID is the full resource ID of the VM it is attached to.
	VirtualMachineID string `json:"virtualMachineId"`
}

// Options change how the emulator serves writes.
type Options struct {
	// Async serves a pool PUT as an asynchronous operation: 201 with an
	// Azure-AsyncOperation header, applied when the operation completes.
	Async bool
	// AsyncPolls is how many status polls answer InProgress before the
	// operation completes.
	AsyncPolls int
	// UnpolledOperationLifetime is how long an operation nobody polls stays in
	// progress, keeping its load balancer busy (zero:
	// DefaultUnpolledOperationLifetime; LongOperation plays
	// cloud-provider-azure's long operations).
	UnpolledOperationLifetime time.Duration
	// WriteThrottle, when set, limits writes per subscription as ARM does:
	// past the limit a write is answered 429 SubscriptionRequestsThrottled
	// with a Retry-After.
	WriteThrottle *WriteThrottle
	// BusyRetryAfter is the Retry-After of a write refused because another
	// operation is updating the load balancer (10 s when zero).
	BusyRetryAfter time.Duration
}

// WriteThrottle allows Writes writes per Window in the subscription.
type WriteThrottle struct {
	Writes int
	Window time.Duration
}

type pool struct {
	lb   string
	data armnetwork.BackendAddressPool
}

type operation struct {
	id        string
	polls     int
	status    string
	apply     func()
	completed bool
	accepted  time.Time
}

// Server is a running emulator.
type Server struct {
	seed Seed
	opts Options

	mu        sync.Mutex
	lbs       []string         // names in seed order
	lbEtag    map[string]int   // key: lower(lb); ETag counter of the load balancer
	writes    []time.Time      // accepted writes, for WriteThrottle
	pools     map[string]*pool // key: lower(lb)/lower(pool)
	poolKeys  []string
	nics      map[string]NetworkInterfaceSeed // key: lower(id)
	vms       map[string]bool                 // key: vmKey(id)
	scaleSets map[string]bool                 // key: vmKey(id) of a VMSS with instances
	groups    map[string]bool                 // key: groupOf(vmKey(id)) of a resource group that held a VM

	faults   []*Fault
	requests []Request
	history  []PoolWrite
	ops      map[string]*operation
	opSeq    int
	busy     map[string]*busyOp // key: lower(lb); an operation updating it

	listener net.Listener
	srv      *http.Server
	url      string
}

// New returns an emulator with the seed's resources, not yet listening; use
// Handler to serve it, or Start.
func New(seed Seed, opts Options) *Server {
	if seed.Location == "" {
		seed.Location = "westeurope"
	}
	seed.ManagedCluster = cloneManagedCluster(seed.ManagedCluster, seed.ResourceGroup)
	s := &Server{seed: seed, opts: opts, lbEtag: map[string]int{}, pools: map[string]*pool{}, nics: map[string]NetworkInterfaceSeed{}, vms: map[string]bool{}, scaleSets: map[string]bool{}, groups: map[string]bool{}, ops: map[string]*operation{}, busy: map[string]*busyOp{}}
	for _, vm := range seed.VMs {
		s.addVM(vm)
	}
	for i, lb := range seed.LoadBalancers {
		s.lbs = append(s.lbs, lb.Name)
		// Distinct load balancers start from distinct ETags.
		s.lbEtag[strings.ToLower(lb.Name)] = 1 + i*1000
		for _, p := range lb.Pools {
			k := key(lb.Name, p.Name)
			s.pools[k] = &pool{lb: lb.Name, data: s.seedPool(lb.Name, p)}
			s.poolKeys = append(s.poolKeys, k)
			s.recordWrite(s.pools[k], "seed", "")
		}
	}
	for _, n := range seed.Interfaces {
		s.nics[strings.ToLower(n.ID)] = n
	}
	return s
}

// Start listens on addr ("127.0.0.1:0" for any free port) and serves in the
// background until Close.
func Start(addr string, seed Seed, opts Options) (*Server, error) {
	s := New(seed, opts)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	s.listener = l
	s.url = "http://" + l.Addr().String()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

// URL is the base URL to use as the ARM endpoint.
func (s *Server) URL() string { return s.url }

// Close stops the server, ending hanging requests.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return s.srv.Close()
	}
	return nil
}

// SetOptions changes how later writes are served.
func (s *Server) SetOptions(o Options) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts = o
}

func key(lb, p string) string { return strings.ToLower(lb) + "/" + strings.ToLower(p) }

func etag(n int) *string {
	v := fmt.Sprintf("W/\"%08x-0000-4000-8000-%012x\"", n, n*7919)
	return &v
}

// etagOf is the current ETag of a load balancer, which all its pools report.
// Call with s.mu held.
func (s *Server) etagOf(lb string) *string { return etag(s.lbEtag[strings.ToLower(lb)]) }

// bump records a write to a load balancer or any of its pools. Call with s.mu held.
func (s *Server) bump(lb string) { s.lbEtag[strings.ToLower(lb)]++ }

// view is a pool as ARM returns it: a copy carrying its load balancer's ETag.
// Call with s.mu held.
func (s *Server) view(p *pool) armnetwork.BackendAddressPool {
	c := clonePool(p.data)
	c.Etag = s.etagOf(p.lb)
	return c
}

func (s *Server) lbID(lb string) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/%s", s.seed.Subscription, s.seed.ResourceGroup, lb)
}

func (s *Server) seedPool(lb string, p PoolSeed) armnetwork.BackendAddressPool {
	id := s.lbID(lb) + "/backendAddressPools/" + p.Name
	props := &armnetwork.BackendAddressPoolPropertiesFormat{
		ProvisioningState:            ptr(armnetwork.ProvisioningStateSucceeded),
		LoadBalancerBackendAddresses: []*armnetwork.LoadBalancerBackendAddress{},
	}
	if p.OutboundOnly {
		props.OutboundRule = &armnetwork.SubResource{ID: ptr(s.lbID(lb) + "/outboundRules/aksOutboundRule")}
		props.OutboundRules = []*armnetwork.SubResource{{ID: ptr(s.lbID(lb) + "/outboundRules/aksOutboundRule")}}
	} else {
		props.LoadBalancingRules = []*armnetwork.SubResource{{ID: ptr(s.lbID(lb) + "/loadBalancingRules/a0123456789abcdef-TCP-80")}}
	}
	for _, e := range p.Entries {
		entry := &armnetwork.LoadBalancerBackendAddress{Name: ptr(e.Name), Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{}}
		if e.IP != "" {
			entry.Properties.IPAddress = ptr(e.IP)
			entry.Properties.VirtualNetwork = &armnetwork.SubResource{ID: ptr(fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/virtualNetworks/aks-vnet", s.seed.Subscription, s.seed.ResourceGroup))}
		}
		if e.IPConfigID != "" {
			entry.Properties.NetworkInterfaceIPConfiguration = &armnetwork.SubResource{ID: ptr(e.IPConfigID)}
			props.BackendIPConfigurations = append(props.BackendIPConfigurations, &armnetwork.InterfaceIPConfiguration{ID: ptr(e.IPConfigID)})
			if e.MemberOnly {
				continue
			}
		}
		if e.AdminState != "" {
			entry.Properties.AdminState = ptr(armnetwork.LoadBalancerBackendAddressAdminState(e.AdminState))
		}
		props.LoadBalancerBackendAddresses = append(props.LoadBalancerBackendAddresses, entry)
	}
	return armnetwork.BackendAddressPool{
		ID: ptr(id), Name: ptr(p.Name), Type: ptr("Microsoft.Network/loadBalancers/backendAddressPools"), Properties: props,
	}
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func clonePool(p armnetwork.BackendAddressPool) armnetwork.BackendAddressPool {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	var c armnetwork.BackendAddressPool
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return c
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	start := time.Now()
	defer func() {
		s.mu.Lock()
		s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, IfMatch: r.Header.Get("If-Match"), Status: rec.status, Start: start, Time: time.Now()})
		s.mu.Unlock()
	}()
	if strings.HasPrefix(r.URL.Path, "/emulator/") {
		s.serveControl(rec, r)
		return
	}
	f := s.matchFault(r)
	if f != nil {
		if f.Before != nil {
			f.Before()
		}
		if f.Delay > 0 {
			select {
			case <-time.After(f.Delay):
			case <-r.Context().Done():
				return
			}
		}
		if f.Hang {
			hang(r)
			return
		}
		if f.Status != 0 {
			if f.RetryAfter != "" {
				rec.Header().Set("Retry-After", f.RetryAfter)
			}
			writeError(rec, f.Status, f.ErrorCode, "injected fault")
			return
		}
	}
	s.serveARM(rec, r, f)
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}
