package main

import (
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"

	"github.com/nodeguard/nodeguard/test/harness"
	"k8s.io/client-go/rest"
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
}

func startRequestCounter(cfg *rest.Config, kubeconfigPath string) (*requestCounter, error) {
	rc := &requestCounter{Kubeconfig: kubeconfigPath, requests: map[string]int{}, evictions: map[int]int{}}
	srv, err := harness.ServeAPIProxy(cfg, kubeconfigPath, func(rp *httputil.ReverseProxy) http.Handler {
		// A client that gives up (its context ends) cancels the request; that
		// is the client's business, not worth a log line each.
		rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			verb, resource := classify(r)
			rc.mu.Lock()
			rc.requests[verb+" "+resource]++
			rc.mu.Unlock()
			if resource == "pods/eviction" && r.Method == http.MethodPost {
				w = harness.OnAnswer(w, func(code int) {
					rc.mu.Lock()
					rc.evictions[code]++
					rc.mu.Unlock()
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

// requestCount is a snapshot of a counter: requests by "VERB resource" and
// eviction answers by status.
type requestCount struct {
	Requests  map[string]int `json:"requests"`
	Evictions map[int]int    `json:"evictions"`
}

func (rc *requestCounter) snapshot() requestCount {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	s := requestCount{Requests: map[string]int{}, Evictions: map[int]int{}}
	for k, v := range rc.requests {
		s.Requests[k] = v
	}
	for k, v := range rc.evictions {
		s.Evictions[k] = v
	}
	return s
}

// since is what was counted after the earlier snapshot.
func (s requestCount) since(earlier requestCount) requestCount {
	d := requestCount{Requests: map[string]int{}, Evictions: map[int]int{}}
	for k, v := range s.Requests {
		if n := v - earlier.Requests[k]; n > 0 {
			d.Requests[k] = n
		}
	}
	for k, v := range s.Evictions {
		if n := v - earlier.Evictions[k]; n > 0 {
			d.Evictions[k] = n
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
