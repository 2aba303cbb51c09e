// The history of every pool's entries, and the whole-load-balancer PUT that
// cloud-provider-azure issues (with If-Match) besides its pool PUTs.

package armemulator

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// PoolWrite is one applied change of a pool's entries (or its seed state,
// with a zero Time).
type PoolWrite struct {
	Time         time.Time
	LoadBalancer string
	Pool         string
	// By is "pool" for a pool PUT, "loadBalancer" for a whole-LB PUT, "test"
	// for MutatePool, "seed" for the initial state.
	By string
	// IfMatch is the write's If-Match header ("" when it had none).
	IfMatch string
	Entries []EntryState
}

// History returns every applied pool write, oldest first, after one "seed"
// write per pool.
func (s *Server) History() []PoolWrite {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]PoolWrite(nil), s.history...)
}

// recordWrite appends a pool's current entries to the history. Call with
// s.mu held.
func (s *Server) recordWrite(p *pool, by, ifMatch string) {
	var at time.Time
	if by != "seed" {
		at = time.Now()
	}
	s.history = append(s.history, PoolWrite{Time: at, LoadBalancer: p.lb, Pool: deref(p.data.Name), By: by, IfMatch: ifMatch, Entries: entryStates(p.data)})
}

func entryStates(p armnetwork.BackendAddressPool) []EntryState {
	var out []EntryState
	for _, e := range p.Properties.LoadBalancerBackendAddresses {
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
		out = append(out, es)
	}
	return out
}

// putLoadBalancer replaces the entries of every pool the body lists (the
// emulator keeps no rules or frontends), with ARM's If-Match check: a
// whole-LB PUT from a stale copy is answered 412.
func (s *Server) putLoadBalancer(w http.ResponseWriter, r *http.Request, name string) {
	var body armnetwork.LoadBalancer
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "InvalidRequestFormat", "cannot parse the request: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.loadBalancer(name); !ok {
		writeError(w, http.StatusNotFound, "NotFound", "load balancer "+name+" not found (creating load balancers is out of scope)")
		return
	}
	if b, busy := s.busyWith(name); busy {
		s.writeBusy(w, name, b)
		return
	}
	current := deref(s.etagOf(name))
	ifMatch := r.Header.Get("If-Match")
	if ifMatch != "" && ifMatch != "*" && ifMatch != current {
		writeError(w, http.StatusPreconditionFailed, "PreconditionFailed", fmt.Sprintf("Precondition failed: If-Match %s does not match the current ETag %s.", ifMatch, current))
		return
	}
	if retryAfter, throttled := s.throttleWrite(); throttled {
		w.Header().Set("Retry-After", retryAfter)
		writeError(w, http.StatusTooManyRequests, "SubscriptionRequestsThrottled", "Number of write requests for subscription '"+s.seed.Subscription+"' exceeded the limit.")
		return
	}
	if body.Properties != nil {
		for _, bp := range body.Properties.BackendAddressPools {
			p, ok := s.pools[key(name, deref(bp.Name))]
			if !ok || bp.Properties == nil {
				continue
			}
			p.data.Properties.LoadBalancerBackendAddresses = writableEntries(p.data.Properties.LoadBalancerBackendAddresses, bp.Properties.LoadBalancerBackendAddresses)
			s.recordWrite(p, "loadBalancer", ifMatch)
		}
	}
	s.bump(name)
	lb, _ := s.loadBalancer(name)
	w.Header().Set("ETag", *lb.Etag)
	writeJSON(w, http.StatusOK, lb)
}

// isLoadBalancerPut reports whether rest (the lower-cased path after
// providers/Microsoft.Network) addresses a whole load balancer for a PUT.
func isLoadBalancerPut(rest []string, method string) bool {
	return len(rest) == 2 && rest[0] == "loadbalancers" && strings.EqualFold(method, http.MethodPut)
}

// OnlyAdminStateChanged checks that every write ours selects left the pool's
// entries as the write before it had them (same names and IPs, same order)
// and changed admin states only. It returns the first violation.
func OnlyAdminStateChanged(history []PoolWrite, ours func(PoolWrite) bool) error {
	last := map[string][]EntryState{}
	for _, w := range history {
		k := key(w.LoadBalancer, w.Pool)
		if prev, ok := last[k]; ok && ours(w) && !sameMembers(prev, w.Entries) {
			return fmt.Errorf("write to %s at %s changed the entries %v to %v", k, w.Time.Format(time.RFC3339Nano), prev, w.Entries)
		}
		last[k] = w.Entries
	}
	return nil
}

func sameMembers(a, b []EntryState) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].IP != b[i].IP || a[i].IPConfigID != b[i].IPConfigID {
			return false
		}
	}
	return true
}

// ByNodeguard selects the pool PUTs that carried If-Match: nodeguard's (the
// cloud-provider-azure actor's pool PUTs carry none).
func ByNodeguard(w PoolWrite) bool { return w.By == "pool" && w.IfMatch != "" }
