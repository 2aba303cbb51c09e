// Package armemulator is an HTTP server that speaks the Azure Resource Manager
// wire format for the network resources nodeguard touches: load balancers,
// their backend address pools, and network interfaces, in one subscription and
// resource group. The real Azure SDK client talks to it over HTTP exactly as to
// Azure (a custom cloud endpoint, InsecureAllowCredentialWithHTTP,
// DisableRPRegistration).
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
	"strconv"
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

// Fault is an injected misbehaviour for the requests it matches.
type Fault struct {
	// Method matches the HTTP method; empty matches any.
	Method string
	// Path matches when the request path contains it (case-insensitive);
	// empty matches any path.
	Path string
	// Times is how many matching requests the fault applies to; 0 is forever.
	Times int

	// Before runs before the request is served, without the emulator's lock
	// (it may call MutatePool: a concurrent writer).
	Before func()
	// Delay is added latency.
	Delay time.Duration
	// Hang holds the request until the client gives up (its context ends).
	Hang bool
	// Status, when non-zero, is answered instead of serving the request, with
	// an ARM error body carrying ErrorCode (a default per status when empty).
	Status     int
	RetryAfter string
	ErrorCode  string
	// OperationStatus, for a PUT served as an asynchronous operation, is the
	// operation's terminal status instead of Succeeded ("Canceled", "Failed");
	// the write is then not applied.
	OperationStatus string
}

// Request is one recorded request.
type Request struct {
	Method  string
	Path    string
	IfMatch string
	Status  int
	// Start is when the request arrived, Time when it was answered.
	Start time.Time
	Time  time.Time
}

// Options change how the emulator serves writes.
type Options struct {
	// Async serves a pool PUT as an asynchronous operation: 201 with an
	// Azure-AsyncOperation header, applied when the operation completes.
	Async bool
	// AsyncPolls is how many status polls answer InProgress before the
	// operation completes.
	AsyncPolls int
	// WriteThrottle, when set, limits writes per subscription as ARM does:
	// past the limit a write is answered 429 SubscriptionRequestsThrottled
	// with a Retry-After.
	WriteThrottle *WriteThrottle
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
}

// Server is a running emulator.
type Server struct {
	seed Seed
	opts Options

	mu       sync.Mutex
	lbs      []string         // names in seed order
	lbEtag   map[string]int   // key: lower(lb); ETag counter of the load balancer
	writes   []time.Time      // accepted writes, for WriteThrottle
	pools    map[string]*pool // key: lower(lb)/lower(pool)
	poolKeys []string
	nics     map[string]NetworkInterfaceSeed // key: lower(id)
	faults   []*Fault
	requests []Request
	ops      map[string]*operation
	opSeq    int

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
	s := &Server{seed: seed, opts: opts, lbEtag: map[string]int{}, pools: map[string]*pool{}, nics: map[string]NetworkInterfaceSeed{}, ops: map[string]*operation{}}
	for i, lb := range seed.LoadBalancers {
		s.lbs = append(s.lbs, lb.Name)
		// Distinct load balancers start from distinct ETags.
		s.lbEtag[strings.ToLower(lb.Name)] = 1 + i*1000
		for _, p := range lb.Pools {
			k := key(lb.Name, p.Name)
			s.pools[k] = &pool{lb: lb.Name, data: s.seedPool(lb.Name, p)}
			s.poolKeys = append(s.poolKeys, k)
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

// AddFault injects a fault; the returned function removes it.
func (s *Server) AddFault(f Fault) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp := &f
	s.faults = append(s.faults, fp)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, g := range s.faults {
			if g == fp {
				s.faults = append(s.faults[:i], s.faults[i+1:]...)
				return
			}
		}
	}
}

// ClearFaults removes every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Requests returns a copy of every request served so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count is how many recorded requests have the method (empty: any) and a
// path containing pathContains (case-insensitive).
func (s *Server) Count(method, pathContains string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if (method == "" || r.Method == method) && strings.Contains(strings.ToLower(r.Path), strings.ToLower(pathContains)) {
			n++
		}
	}
	return n
}

// ResetRequests forgets the recorded requests.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

// Pool returns a copy of a backend pool as stored (nil when absent).
func (s *Server) Pool(lb, name string) *armnetwork.BackendAddressPool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pools[key(lb, name)]
	if !ok {
		return nil
	}
	c := s.view(p)
	return &c
}

// MutatePool changes a pool as another writer would, bumping its load
// balancer's ETag. It reports false when the pool does not exist.
func (s *Server) MutatePool(lb, name string, mutate func(*armnetwork.BackendAddressPool)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pools[key(lb, name)]
	if !ok {
		return false
	}
	mutate(&p.data)
	s.bump(p.lb)
	return true
}

// Status counts recorded requests answered with status, by method (empty:
// any) and path substring (case-insensitive).
func (s *Server) Status(method, pathContains string, status int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Status == status && (method == "" || r.Method == method) && strings.Contains(strings.ToLower(r.Path), strings.ToLower(pathContains)) {
			n++
		}
	}
	return n
}

// DeletePool removes a pool (later requests for it get 404).
func (s *Server) DeletePool(lb, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := key(lb, name)
	if _, ok := s.pools[k]; ok {
		s.bump(lb)
	}
	delete(s.pools, k)
	for i, pk := range s.poolKeys {
		if pk == k {
			s.poolKeys = append(s.poolKeys[:i], s.poolKeys[i+1:]...)
			break
		}
	}
}

// EntryState is one backend address in a State dump.
type EntryState struct {
	Name       string `json:"name"`
	IP         string `json:"ip,omitempty"`
	IPConfigID string `json:"ipConfigId,omitempty"`
	AdminState string `json:"adminState"`
}

// PoolState is one pool in a State dump.
type PoolState struct {
	LoadBalancer string       `json:"loadBalancer"`
	Pool         string       `json:"pool"`
	Etag         string       `json:"etag"`
	Entries      []EntryState `json:"entries"`
	// Members are the pool's backendIPConfigurations (NIC-based members).
	Members []string `json:"members,omitempty"`
}

// State dumps every pool's entries and admin states (also served at
// GET /emulator/state).
func (s *Server) State() []PoolState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PoolState
	for _, k := range s.poolKeys {
		p := s.pools[k]
		ps := PoolState{LoadBalancer: p.lb, Pool: deref(p.data.Name), Etag: deref(s.etagOf(p.lb))}
		for _, c := range p.data.Properties.BackendIPConfigurations {
			ps.Members = append(ps.Members, deref(c.ID))
		}
		for _, e := range p.data.Properties.LoadBalancerBackendAddresses {
			es := EntryState{Name: deref(e.Name), AdminState: "None"}
			if e.Properties != nil {
				es.IP = deref(e.Properties.IPAddress)
				if e.Properties.NetworkInterfaceIPConfiguration != nil {
					es.IPConfigID = deref(e.Properties.NetworkInterfaceIPConfiguration.ID)
				}
				if e.Properties.AdminState != nil {
					es.AdminState = string(*e.Properties.AdminState)
				}
			}
			ps.Entries = append(ps.Entries, es)
		}
		out = append(out, ps)
	}
	return out
}

// AdminStates maps "lb/pool/entry" to each entry's admin state ("None" when unset).
func (s *Server) AdminStates() map[string]string {
	out := map[string]string{}
	for _, p := range s.State() {
		for _, e := range p.Entries {
			out[p.LoadBalancer+"/"+p.Pool+"/"+e.Name] = e.AdminState
		}
	}
	return out
}

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

func (s *Server) matchFault(r *http.Request) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := strings.ToLower(r.URL.Path)
	for i, f := range s.faults {
		if f.Method != "" && !strings.EqualFold(f.Method, r.Method) {
			continue
		}
		if f.Path != "" && !strings.Contains(path, strings.ToLower(f.Path)) {
			continue
		}
		if f.Times > 0 {
			f.Times--
			if f.Times == 0 {
				s.faults = append(s.faults[:i], s.faults[i+1:]...)
			}
		}
		c := *f
		return &c
	}
	return nil
}

var defaultCodes = map[int]string{
	http.StatusTooManyRequests:     "SubscriptionRequestsThrottled",
	http.StatusConflict:            "AnotherOperationInProgress",
	http.StatusPreconditionFailed:  "PreconditionFailed",
	http.StatusNotFound:            "NotFound",
	http.StatusInternalServerError: "InternalServerError",
	http.StatusBadRequest:          "InvalidRequestFormat",
	http.StatusForbidden:           "AuthorizationFailed",
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if code == "" {
		code = defaultCodes[status]
		if code == "" {
			code = http.StatusText(status)
		}
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("x-ms-failure-cause", "gateway")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serveARM routes /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Network/...
// and the operation status endpoint, case-insensitively.
func (s *Server) serveARM(w http.ResponseWriter, r *http.Request, f *Fault) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	lower := make([]string, len(parts))
	for i, p := range parts {
		lower[i] = strings.ToLower(p)
	}
	// /subscriptions/{s}/providers/Microsoft.Network/locations/{loc}/operations/{id}
	if len(lower) == 8 && lower[0] == "subscriptions" && lower[2] == "providers" && lower[4] == "locations" && lower[6] == "operations" {
		s.serveOperation(w, parts[7])
		return
	}
	if len(lower) < 6 || lower[0] != "subscriptions" || lower[2] != "resourcegroups" || lower[4] != "providers" || lower[5] != "microsoft.network" {
		writeError(w, http.StatusNotFound, "InvalidResourceType", "unknown path "+r.URL.Path)
		return
	}
	if !strings.EqualFold(parts[1], s.seed.Subscription) || !strings.EqualFold(parts[3], s.seed.ResourceGroup) {
		writeError(w, http.StatusNotFound, "ResourceGroupNotFound", fmt.Sprintf("Resource group '%s' could not be found.", parts[3]))
		return
	}
	rest := lower[6:]
	switch {
	case len(rest) == 1 && rest[0] == "loadbalancers" && r.Method == http.MethodGet:
		s.listLoadBalancers(w)
	case len(rest) == 2 && rest[0] == "loadbalancers" && r.Method == http.MethodGet:
		s.getLoadBalancer(w, parts[7])
	case len(rest) == 3 && rest[0] == "loadbalancers" && rest[2] == "backendaddresspools" && r.Method == http.MethodGet:
		s.listPools(w, parts[7])
	case len(rest) == 4 && rest[0] == "loadbalancers" && rest[2] == "backendaddresspools" && r.Method == http.MethodGet:
		s.getPool(w, parts[7], parts[9])
	case len(rest) == 4 && rest[0] == "loadbalancers" && rest[2] == "backendaddresspools" && r.Method == http.MethodPut:
		s.putPool(w, r, parts[7], parts[9], f)
	case len(rest) == 2 && rest[0] == "networkinterfaces" && r.Method == http.MethodGet:
		s.getInterface(w, r.URL.Path)
	default:
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" "+r.URL.Path)
	}
}

func (s *Server) loadBalancer(name string) (armnetwork.LoadBalancer, bool) {
	var found string
	for _, n := range s.lbs {
		if strings.EqualFold(n, name) {
			found = n
		}
	}
	if found == "" {
		return armnetwork.LoadBalancer{}, false
	}
	lb := armnetwork.LoadBalancer{
		ID: ptr(s.lbID(found)), Name: ptr(found), Location: ptr(s.seed.Location), Type: ptr("Microsoft.Network/loadBalancers"),
		Etag: s.etagOf(found),
		SKU:  &armnetwork.LoadBalancerSKU{Name: ptr(armnetwork.LoadBalancerSKUNameStandard), Tier: ptr(armnetwork.LoadBalancerSKUTierRegional)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{
			ProvisioningState:   ptr(armnetwork.ProvisioningStateSucceeded),
			BackendAddressPools: []*armnetwork.BackendAddressPool{},
		},
	}
	for _, k := range s.poolKeys {
		p := s.pools[k]
		if strings.EqualFold(p.lb, found) {
			c := s.view(p)
			lb.Properties.BackendAddressPools = append(lb.Properties.BackendAddressPools, &c)
		}
	}
	return lb, true
}

func (s *Server) listLoadBalancers(w http.ResponseWriter) {
	s.mu.Lock()
	var res armnetwork.LoadBalancerListResult
	for _, n := range s.lbs {
		lb, _ := s.loadBalancer(n)
		res.Value = append(res.Value, &lb)
	}
	s.mu.Unlock()
	if res.Value == nil {
		res.Value = []*armnetwork.LoadBalancer{}
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) getLoadBalancer(w http.ResponseWriter, name string) {
	s.mu.Lock()
	lb, ok := s.loadBalancer(name)
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "ResourceNotFound", fmt.Sprintf("The Resource 'Microsoft.Network/loadBalancers/%s' under resource group '%s' was not found.", name, s.seed.ResourceGroup))
		return
	}
	writeJSON(w, http.StatusOK, lb)
}

func (s *Server) listPools(w http.ResponseWriter, lbName string) {
	s.mu.Lock()
	lb, ok := s.loadBalancer(lbName)
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "ResourceNotFound", "load balancer "+lbName+" not found")
		return
	}
	writeJSON(w, http.StatusOK, armnetwork.LoadBalancerBackendAddressPoolListResult{Value: lb.Properties.BackendAddressPools})
}

func (s *Server) getPool(w http.ResponseWriter, lb, name string) {
	s.mu.Lock()
	p, ok := s.pools[key(lb, name)]
	var c armnetwork.BackendAddressPool
	if ok {
		c = s.view(p)
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "NotFound", fmt.Sprintf("Resource /subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/%s/backendAddressPools/%s not found.", s.seed.Subscription, s.seed.ResourceGroup, lb, name))
		return
	}
	if c.Etag != nil {
		w.Header().Set("ETag", *c.Etag)
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) putPool(w http.ResponseWriter, r *http.Request, lb, name string, f *Fault) {
	var body armnetwork.BackendAddressPool
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestFormat", "cannot parse the request: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pools[key(lb, name)]
	if !ok {
		// Creating pools is out of scope: nodeguard only updates them.
		writeError(w, http.StatusNotFound, "NotFound", "backend pool "+lb+"/"+name+" not found")
		return
	}
	current := deref(s.etagOf(p.lb))
	if im := r.Header.Get("If-Match"); im != "" && im != "*" && im != current {
		writeError(w, http.StatusPreconditionFailed, "PreconditionFailed", fmt.Sprintf("Precondition failed: If-Match %s does not match the current ETag %s.", im, current))
		return
	}
	if retryAfter, throttled := s.throttleWrite(); throttled {
		w.Header().Set("Retry-After", retryAfter)
		writeError(w, http.StatusTooManyRequests, "SubscriptionRequestsThrottled", "Number of write requests for subscription '"+s.seed.Subscription+"' exceeded the limit.")
		return
	}
	var entries []*armnetwork.LoadBalancerBackendAddress
	if body.Properties != nil {
		entries = writableEntries(p.data.Properties.LoadBalancerBackendAddresses, body.Properties.LoadBalancerBackendAddresses)
	}
	apply := func() {
		p.data.Properties.LoadBalancerBackendAddresses = entries
		s.bump(p.lb)
	}
	if !s.opts.Async {
		apply()
		c := s.view(p)
		w.Header().Set("ETag", *c.Etag)
		writeJSON(w, http.StatusOK, c)
		return
	}
	s.opSeq++
	op := &operation{id: fmt.Sprintf("op-%06d", s.opSeq), polls: s.opts.AsyncPolls, status: "Succeeded", apply: apply}
	if f != nil && f.OperationStatus != "" {
		op.status = f.OperationStatus
	}
	s.ops[strings.ToLower(op.id)] = op
	c := s.view(p)
	c.Properties.LoadBalancerBackendAddresses = entries
	c.Properties.ProvisioningState = ptr(armnetwork.ProvisioningStateUpdating)
	scheme := "http"
	w.Header().Set("Azure-AsyncOperation", fmt.Sprintf("%s://%s/subscriptions/%s/providers/Microsoft.Network/locations/%s/operations/%s?api-version=%s",
		scheme, r.Host, s.seed.Subscription, s.seed.Location, op.id, APIVersion))
	w.Header().Set("Retry-After", "0")
	writeJSON(w, http.StatusCreated, c)
}

// throttleWrite counts a write against the subscription's WriteThrottle. It
// returns the Retry-After (whole seconds) when the write is refused. Call
// with s.mu held.
func (s *Server) throttleWrite() (string, bool) {
	t := s.opts.WriteThrottle
	if t == nil || t.Writes <= 0 {
		return "", false
	}
	now := time.Now()
	kept := s.writes[:0]
	for _, at := range s.writes {
		if now.Sub(at) < t.Window {
			kept = append(kept, at)
		}
	}
	s.writes = kept
	if len(s.writes) >= t.Writes {
		wait := s.writes[0].Add(t.Window).Sub(now)
		return strconv.Itoa(int((wait + time.Second - 1) / time.Second)), true
	}
	s.writes = append(s.writes, now)
	return "", false
}

// writableEntries is what a PUT's entries become: networkInterfaceIPConfiguration
// is read-only (a NIC joins a pool through its own IP configuration), so a
// NIC-based entry the pool did not have is ignored, and an existing one
// keeps its reference.
func writableEntries(have, put []*armnetwork.LoadBalancerBackendAddress) []*armnetwork.LoadBalancerBackendAddress {
	nicEntry := map[string]bool{}
	for _, e := range have {
		if id := nicConfigID(e); id != "" {
			nicEntry[strings.ToLower(id)] = true
		}
	}
	out := make([]*armnetwork.LoadBalancerBackendAddress, 0, len(put))
	for _, e := range put {
		if id := nicConfigID(e); id != "" && !nicEntry[strings.ToLower(id)] {
			continue
		}
		out = append(out, e)
	}
	return out
}

func nicConfigID(e *armnetwork.LoadBalancerBackendAddress) string {
	if e == nil || e.Properties == nil || e.Properties.NetworkInterfaceIPConfiguration == nil {
		return ""
	}
	return deref(e.Properties.NetworkInterfaceIPConfiguration.ID)
}

func (s *Server) serveOperation(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[strings.ToLower(id)]
	if !ok {
		writeError(w, http.StatusNotFound, "NotFound", "operation "+id+" not found")
		return
	}
	if op.polls > 0 {
		op.polls--
		writeJSON(w, http.StatusOK, map[string]string{"name": op.id, "status": "InProgress"})
		return
	}
	if !op.completed {
		op.completed = true
		if op.status == "Succeeded" {
			op.apply()
		}
	}
	res := map[string]any{"name": op.id, "status": op.status}
	if op.status != "Succeeded" {
		code := op.status
		res["error"] = map[string]string{"code": code, "message": "Operation was " + strings.ToLower(op.status) + "."}
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) getInterface(w http.ResponseWriter, path string) {
	s.mu.Lock()
	n, ok := s.nics[strings.ToLower(path)]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "NotFound", "network interface "+path+" not found")
		return
	}
	writeJSON(w, http.StatusOK, s.interfaceView(n))
}

// serveControl serves the emulator's own endpoints:
//
//	GET /emulator/state     every pool's entries and admin states
//	GET /emulator/requests  every recorded request
//	GET /emulator/counts    requests counted by method and resource kind
func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/emulator/state":
		writeJSON(w, http.StatusOK, s.State())
	case "/emulator/requests":
		writeJSON(w, http.StatusOK, s.Requests())
	case "/emulator/counts":
		counts := map[string]int{}
		for _, q := range s.Requests() {
			if strings.HasPrefix(q.Path, "/emulator/") {
				continue
			}
			counts[q.Method+" "+kind(q.Path)+" "+strconv.Itoa(q.Status)]++
		}
		writeJSON(w, http.StatusOK, counts)
	default:
		writeError(w, http.StatusNotFound, "NotFound", r.URL.Path)
	}
}

func kind(path string) string {
	p := strings.ToLower(path)
	switch {
	case strings.Contains(p, "/operations/"):
		return "operation"
	case strings.Contains(p, "/backendaddresspools/"):
		return "backendAddressPool"
	case strings.Contains(p, "/networkinterfaces/"):
		return "networkInterface"
	case strings.Contains(p, "/loadbalancers"):
		return "loadBalancer"
	}
	return "other"
}
