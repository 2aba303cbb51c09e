package main

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

// requestCounter is a reverse proxy to kube-apiserver that counts every
// request a client sends through it, by verb and resource, and the answers
// to its eviction requests. The apiserver's own apiserver_request_total has
// no user-agent label, and nodeguard and kubectl use the same admin user, so
// the bench gives each drainer a proxy of its own.
type requestCounter struct {
	// Kubeconfig points a client at the proxy, as the cluster admin.
	Kubeconfig string

	srv *http.Server

	mu        sync.Mutex
	requests  map[string]int // "VERB resource[/subresource]"
	evictions map[int]int    // by HTTP status
	writes    map[string]int // node-status and event writes by what they say (writeReason)
	// marks are the node writes and evictions while a deletion is timed
	// (track); nil when none is.
	marks []requestMark
}

func startRequestCounter(cfg *rest.Config, kubeconfigPath string) (*requestCounter, error) {
	rc := &requestCounter{Kubeconfig: kubeconfigPath, requests: map[string]int{}, evictions: map[int]int{}, writes: map[string]int{}}
	srv, err := harness.ServeAPIProxy(cfg, kubeconfigPath, func(rp *httputil.ReverseProxy) http.Handler {
		// A client that gives up (its context ends) cancels the request; that
		// is the client's business, not worth a log line each.
		rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			verb, resource := classify(r)
			why := writeReason(r, verb, resource)
			rc.mu.Lock()
			rc.requests[verb+" "+resource]++
			if why != "" {
				rc.writes[why]++
			}
			rc.mu.Unlock()
			kind, name := markOf(r, verb, resource)
			rc.mark(kind, name)
			if resource == "pods/eviction" && r.Method == http.MethodPost {
				w = harness.OnAnswer(w, func(code int) {
					rc.mu.Lock()
					rc.evictions[code]++
					rc.mu.Unlock()
					if code/100 == 2 {
						rc.mark(markEvicted, name)
					}
				})
			}
			rp.ServeHTTP(w, r)
		})
	})
	if err != nil {
		return nil, err
	}
	rc.srv = srv
	return rc, nil
}

func (rc *requestCounter) close() { _ = rc.srv.Close() }

// track starts marking node writes and evictions; the function it returns
// stops and returns the marks.
func (rc *requestCounter) track() (stop func() []requestMark) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.marks = []requestMark{}
	return func() []requestMark {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		marks := rc.marks
		rc.marks = nil
		return marks
	}
}

// mark records a request of the timed deletion, if one is timed.
func (rc *requestCounter) mark(kind, name string) {
	if kind == "" {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.marks != nil {
		rc.marks = append(rc.marks, requestMark{At: time.Now(), Kind: kind, Name: name})
	}
}

// requestCount is a snapshot of a counter: requests by "VERB resource" and
// eviction answers by status.
type requestCount struct {
	Requests  map[string]int `json:"requests"`
	Evictions map[int]int    `json:"evictions"`
	// Writes are the node-status and event writes by what they say.
	Writes map[string]int `json:"writes,omitempty"`
}

func (rc *requestCounter) snapshot() requestCount {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return requestCount{Requests: maps.Clone(rc.requests), Evictions: maps.Clone(rc.evictions), Writes: maps.Clone(rc.writes)}
}

// since is what was counted after the earlier snapshot.
func (s requestCount) since(earlier requestCount) requestCount {
	return requestCount{Requests: countsSince(s.Requests, earlier.Requests), Evictions: countsSince(s.Evictions, earlier.Evictions),
		Writes: countsSince(s.Writes, earlier.Writes)}
}

// countsSince is what a count gained since an earlier one, key by key.
func countsSince[K comparable](now, earlier map[K]int) map[K]int {
	d := map[K]int{}
	for k, v := range now {
		if n := v - earlier[k]; n > 0 {
			d[k] = n
		}
	}
	return d
}

func (s requestCount) total() int {
	n := 0
	for _, v := range s.Requests {
		n += v
	}
	return n
}

func (s requestCount) evictionRequests() int {
	n := 0
	for _, v := range s.Evictions {
		n += v
	}
	return n
}

// classify names a request the way apiserver_request_total does: a verb
// (GET, LIST, WATCH, CREATE, UPDATE, PATCH, DELETE) and a resource with its
// subresource; discovery and other non-resource paths are "GET /path".
func classify(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return r.Method, r.URL.Path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	resource = parts[0]
	named := len(parts) >= 2
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	switch r.Method {
	case http.MethodGet:
		switch {
		case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
			verb = "WATCH"
		case named:
			verb = "GET"
		default:
			verb = "LIST"
		}
	case http.MethodPost:
		verb = "CREATE"
	case http.MethodPut:
		verb = "UPDATE"
	default:
		verb = r.Method
	}
	return verb, resource
}

// writeReason names a node-status or event write by what it says: "status
// <the Terminating condition's reason>" (or the condition types it writes),
// "event <reason>", or "event series" for a series' count. Other requests
// have none.
func writeReason(r *http.Request, verb, resource string) string {
	switch {
	case resource == "nodes/status" && verb == "PATCH":
	case resource == "events" && verb == "CREATE":
	case resource == "events" && verb == "PATCH":
		return "event series"
	default:
		return ""
	}
	// The first MiB: a status patch or an event is far smaller.
	body, err := harness.PeekBody(r, 1<<20)
	if err != nil {
		return ""
	}
	if resource == "events" {
		// JSON or protobuf, as the client chose.
		obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		switch ev := obj.(type) {
		case *eventsv1.Event:
			return "event " + ev.Reason
		case *corev1.Event:
			return "event " + ev.Reason
		default:
			return fmt.Sprintf("event (unread: %v)", err)
		}
	}
	conditions, _ := harness.PatchedConditions(body)
	var types []string
	for _, c := range conditions {
		switch {
		case c.Type == string(ngv1alpha1.TerminatingCondition) && c.Patch == "":
			return "status " + c.Reason
		case c.Patch == "delete":
			types = append(types, "-"+c.Type)
		default:
			types = append(types, c.Type)
		}
	}
	return "status " + strings.Join(types, ",")
}

// writesByReason lists the writes by what they say, per one of n objects
// (the deleted nodes), most first.
func (s requestCount) writesByReason(n int) string {
	var parts []string
	for _, e := range mostFirst(s.Writes) {
		parts = append(parts, fmt.Sprintf("%s %.2f", e.key, float64(e.n)/float64(max(n, 1))))
	}
	return strings.Join(parts, ", ")
}

// counted is one key of a count and its number.
type counted struct {
	key string
	n   int
}

// mostFirst orders a count's keys by their number, most first (then by
// name).
func mostFirst(counts map[string]int) []counted {
	all := make([]counted, 0, len(counts))
	for k, v := range counts {
		all = append(all, counted{k, v})
	}
	slices.SortFunc(all, func(a, b counted) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return strings.Compare(a.key, b.key)
	})
	return all
}
