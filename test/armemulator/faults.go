// Fault injection: a request meets the first fault that matches it.

package armemulator

import (
	"net/http"
	"strings"
	"time"
)

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
