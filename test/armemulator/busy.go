// A load balancer that another operation is updating: the network resource
// provider refuses writes to it and to its pools with 429 RetryableError
// (details RetryableErrorDueToAnotherOperation) until that operation ends.
// cloud-provider-azure reconciling the load balancer while nodes come and go
// is such an operation on every AKS cluster.

package armemulator

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// defaultBusyRetryAfter is the Retry-After of a busy answer when
// Options.BusyRetryAfter is unset (ARM's messages say "can be retried in 10
// seconds" or so).
const defaultBusyRetryAfter = 10 * time.Second

// DefaultUnpolledOperationLifetime is how long an asynchronous operation
// nobody polls stays in progress unless Options say otherwise: ARM finishes
// operations whether or not the caller watches (a caller that dies, like a
// killed leader, strands none), and a backend pool update takes seconds.
const DefaultUnpolledOperationLifetime = 3 * time.Second

// LongOperation is the lifetime of a long cloud-provider-azure load-balancer
// operation (a large load balancer's update can take that long on Azure),
// for Options.UnpolledOperationLifetime.
const LongOperation = 30 * time.Second

// unpolledLifetime is how long an operation nobody polls stays in progress.
func (s *Server) unpolledLifetime() time.Duration {
	if s.opts.UnpolledOperationLifetime > 0 {
		return s.opts.UnpolledOperationLifetime
	}
	return DefaultUnpolledOperationLifetime
}

// busyOp is an operation in progress on a load balancer.
type busyOp struct {
	lb   string
	name string     // e.g. "PutLoadBalancerOperation (ext-000001)"
	op   *operation // nil for one begun with BeginOperation
}

// BeginOperation starts an operation on the load balancer by another writer
// (as cloud-provider-azure's PutLoadBalancerOperation): until end is called,
// every PUT to the load balancer's pools is answered 429 RetryableError.
func (s *Server) BeginOperation(lb string) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opSeq++
	b := &busyOp{lb: lb, name: fmt.Sprintf("PutLoadBalancerOperation (ext-%06d)", s.opSeq)}
	s.busy[strings.ToLower(lb)] = b
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.busy[strings.ToLower(lb)] == b {
			delete(s.busy, strings.ToLower(lb))
		}
	}
}

// busyWith returns the operation updating the load balancer, if any, first
// finishing an asynchronous one that outlived its unpolled lifetime. Call with s.mu held.
func (s *Server) busyWith(lb string) (*busyOp, bool) {
	b, ok := s.busy[strings.ToLower(lb)]
	if !ok {
		return nil, false
	}
	if b.op != nil && !b.op.completed && time.Since(b.op.accepted) > s.unpolledLifetime() {
		s.complete(b.op)
	}
	if b.op != nil && b.op.completed {
		delete(s.busy, strings.ToLower(lb))
		return nil, false
	}
	return b, true
}

// settle ends every operation nobody polled once it outlived its unpolled lifetime, as
// ARM finishes operations on its own time: any request sees the end.
func (s *Server) settle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.busy {
		if b.op != nil {
			s.busyWith(b.lb)
		}
	}
}

// writeBusy answers a write to a load balancer another operation is updating.
func (s *Server) writeBusy(w http.ResponseWriter, lb string, b *busyOp) {
	after := s.opts.BusyRetryAfter
	if after <= 0 {
		after = defaultBusyRetryAfter
	}
	secs := int((after + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	detail := fmt.Sprintf("Operation %s is updating resource %s. The call can be retried in %d seconds.", b.name, s.lbID(lb), secs)
	writeJSON(w, http.StatusTooManyRequests, map[string]any{"error": map[string]any{
		"code":    "RetryableError",
		"message": "A retryable error occurred.",
		"details": []map[string]string{{"code": "RetryableErrorDueToAnotherOperation", "message": detail}},
	}})
}
