// What tests read and change besides the ARM API: recorded requests, pool
// state, and the /emulator/ control endpoints.

package armemulator

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

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
	s.recordWrite(p, "test", "")
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

// Busy reports whether an operation is updating the load balancer (its
// writes are answered 429 RetryableError).
func (s *Server) Busy(lb string) bool {
	s.settle()
	s.mu.Lock()
	defer s.mu.Unlock()
	_, busy := s.busyWith(lb)
	return busy
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
		ps.Entries = entryStates(p.data)
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
			counts[q.Method+" "+Kind(q.Path)+" "+strconv.Itoa(q.Status)]++
		}
		writeJSON(w, http.StatusOK, counts)
	default:
		writeError(w, http.StatusNotFound, "NotFound", r.URL.Path)
	}
}

// Kind names what a request path addresses: operation, backendAddressPool,
// networkInterface, loadBalancer, agentPool or other.
func Kind(path string) string {
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
	case strings.Contains(p, "/agentpools"):
		return "agentPool"
	}
	return "other"
}
