// The ARM wire format: load balancers, backend pools (ETags, If-Match,
// asynchronous writes, the write throttle), operations and NICs.

package armemulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

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
	s.settle()
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
	if len(lower) >= 8 && lower[0] == "subscriptions" && lower[2] == "resourcegroups" && lower[4] == "providers" && lower[5] == "microsoft.compute" && r.Method == http.MethodGet &&
		(len(lower) == 8 && lower[6] == "virtualmachines" || len(lower) == 10 && lower[6] == "virtualmachinescalesets" && lower[8] == "virtualmachines") {
		s.getVM(w, r.URL.Path)
		return
	}
	if len(lower) >= 8 && lower[0] == "subscriptions" && lower[2] == "resourcegroups" && lower[4] == "providers" && lower[5] == "microsoft.containerservice" {
		s.serveContainerService(w, r, parts, lower)
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
	case isLoadBalancerPut(rest, r.Method):
		s.putLoadBalancer(w, r, parts[7])
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
	if b, busy := s.busyWith(p.lb); busy {
		s.writeBusy(w, p.lb, b)
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
	ifMatch := r.Header.Get("If-Match")
	apply := func() {
		p.data.Properties.LoadBalancerBackendAddresses = entries
		s.bump(p.lb)
		s.recordWrite(p, "pool", ifMatch)
	}
	if !s.opts.Async {
		apply()
		c := s.view(p)
		w.Header().Set("ETag", *c.Etag)
		writeJSON(w, http.StatusOK, c)
		return
	}
	s.opSeq++
	op := &operation{id: fmt.Sprintf("op-%06d", s.opSeq), polls: s.opts.AsyncPolls, status: "Succeeded", apply: apply, accepted: time.Now()}
	if f != nil && f.OperationStatus != "" {
		op.status = f.OperationStatus
	}
	if op.status == "Succeeded" {
		// ARM stores the goal state when it accepts the PUT: from then on a
		// GET shows it, Updating, with a new ETag; the operation's end sets
		// Succeeded, which changes the ETag once more. (An operation that
		// will fail is applied never, as if ARM rolled it back.)
		apply()
		p.data.Properties.ProvisioningState = ptr(armnetwork.ProvisioningStateUpdating)
		op.apply = func() {
			p.data.Properties.ProvisioningState = ptr(armnetwork.ProvisioningStateSucceeded)
			s.bump(p.lb)
		}
	}
	s.ops[strings.ToLower(op.id)] = op
	// Until it completes, the load balancer refuses other writes.
	s.busy[strings.ToLower(p.lb)] = &busyOp{lb: p.lb, name: fmt.Sprintf("PutLoadBalancerBackendAddressPoolOperation (%s)", op.id), op: op}
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
	s.complete(op)
	res := map[string]any{"name": op.id, "status": op.status}
	if op.status != "Succeeded" {
		code := op.status
		res["error"] = map[string]string{"code": code, "message": "Operation was " + strings.ToLower(op.status) + "."}
	}
	writeJSON(w, http.StatusOK, res)
}

// complete ends an operation, applying its write if it succeeded. Call with
// s.mu held.
func (s *Server) complete(op *operation) {
	if op.completed {
		return
	}
	op.completed = true
	if op.status == "Succeeded" {
		op.apply()
	}
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
