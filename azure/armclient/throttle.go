package armclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"k8s.io/utils/clock"
)

// ErrTooManyRequests is what every throttled call unwraps to.
var ErrTooManyRequests = errors.New("too many requests to Azure Resource Manager")

// ThrottleError is a call refused for throttling: either ARM answered 429, or
// the local gate held the call back because an earlier 429 asked to wait (for
// a write: any write in the subscription; for a read: the same resource). RetryAfter is when the resource may be called again;
// it is not in the future when ARM gave no usable Retry-After.
type ThrottleError struct {
	RetryAfter time.Time
	// FromGate is true when no request reached ARM (the local gate path).
	FromGate bool
	// ResourceBusy is true when ARM refused because another operation is
	// updating the resource (not the subscription's request budget).
	ResourceBusy bool
}

func (e *ThrottleError) Error() string {
	what := ErrTooManyRequests.Error()
	if e.ResourceBusy {
		what = "another operation is updating the resource"
	}
	return what + ", retry after " + e.RetryAfter.UTC().Format(time.RFC3339)
}

// Unwrap makes errors.Is(err, ErrTooManyRequests) true.
func (e *ThrottleError) Unwrap() error { return ErrTooManyRequests }

// NonRetriable tells the SDK's retry policy not to retry: the caller parks the
// work until RetryAfter instead of spinning against the gate.
func (e *ThrottleError) NonRetriable() {}

// ThrottlingPolicy is a per-retry pipeline policy. It turns a 429 response
// into a *ThrottleError and remembers its Retry-After; later calls under the
// same gate before then fail with a *ThrottleError without reaching ARM. ARM
// counts writes per subscription, so a write's 429 gates every write in the
// subscription; a read's gates reads of that resource (the URL path). One 429
// is not about the subscription: the network resource provider answers
// RetryableError while another operation (cloud-provider-azure reconciling
// the load balancer, say) is updating the resource. That one gates writes to
// that load balancer only, so that a busy load balancer delays no other.
type ThrottlingPolicy struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	gates map[string]time.Time
}

// NewThrottlingPolicy returns a policy reading time from clk (a real clock when nil).
func NewThrottlingPolicy(clk clock.PassiveClock) *ThrottlingPolicy {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &ThrottlingPolicy{clock: clk, gates: map[string]time.Time{}}
}

// Do implements policy.Policy.
func (p *ThrottlingPolicy) Do(req *policy.Request) (*http.Response, error) {
	method, path := req.Raw().Method, req.Raw().URL.Path
	gateKey, busyKey := GateKey(method, path), busyGateKey(method, path)
	now := p.clock.Now()
	if until, gated := p.gatedUntil(now, gateKey); gated {
		return nil, &ThrottleError{RetryAfter: until, FromGate: true}
	}
	if until, gated := p.gatedUntil(now, busyKey); gated {
		return nil, &ThrottleError{RetryAfter: until, FromGate: true, ResourceBusy: true}
	}
	resp, err := req.Next()
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return resp, err
	}
	busy := busyKey != "" && responseErrorCode(resp) == codeResourceBusy
	if busy {
		gateKey = busyKey
	}
	_ = resp.Body.Close()
	retryAfter, ok := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		// Unparsable: keep whatever the gate said before.
		retryAfter = p.gates[gateKey]
	} else {
		p.gates[gateKey] = retryAfter
	}
	return nil, &ThrottleError{RetryAfter: retryAfter, ResourceBusy: busy}
}

// gatedUntil returns when the gate key opens, if it is closed now.
func (p *ThrottlingPolicy) gatedUntil(now time.Time, key string) (time.Time, bool) {
	if key == "" {
		return time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.gates[key]
	return until, ok && until.After(now)
}

// codeResourceBusy is the network resource provider's 429 for a resource
// another operation is updating (details: RetryableErrorDueToAnotherOperation).
const codeResourceBusy = "RetryableError"

// responseErrorCode reads the ARM error code of a response, leaving its body readable.
func responseErrorCode(resp *http.Response) string {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return ""
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Code
}

// busyGateKey is the gate of a write to a top-level resource and its child
// resources ("busy:<subscription>/<provider>/<type>/<name>", e.g. a load
// balancer and its backend pools), or "" for a read or a path without one.
func busyGateKey(method, path string) string {
	switch method {
	case http.MethodPut, http.MethodPatch, http.MethodPost, http.MethodDelete:
	default:
		return ""
	}
	parts := strings.Split(strings.ToLower(strings.Trim(path, "/")), "/")
	// subscriptions/<s>/resourcegroups/<rg>/providers/<ns>/<type>/<name>/...
	if len(parts) < 8 || parts[0] != "subscriptions" || parts[2] != "resourcegroups" || parts[4] != "providers" {
		return ""
	}
	return "busy:" + strings.Join(parts[:8], "/")
}

// GateKey is the throttling gate a request falls under: "write:<subscription>"
// for PUT, PATCH, POST and DELETE (ARM's write budget is per subscription),
// else "read:<path>".
func GateKey(method, path string) string {
	p := strings.ToLower(path)
	switch method {
	case http.MethodPut, http.MethodPatch, http.MethodPost, http.MethodDelete:
		if rest, ok := strings.CutPrefix(p, "/subscriptions/"); ok {
			sub, _, _ := strings.Cut(rest, "/")
			return "write:" + sub
		}
		return "write:"
	}
	return "read:" + p
}

// parseRetryAfter reads integer seconds or an HTTP date. A missing header
// means "now" (no wait asked); ok is false when the header is unparsable.
func parseRetryAfter(v string, now time.Time) (time.Time, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return now, true
	}
	if secs, err := strconv.Atoi(v); err == nil {
		if secs < 0 {
			secs = 0
		}
		return now.Add(time.Duration(secs) * time.Second), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return t, true
	}
	return time.Time{}, false
}
