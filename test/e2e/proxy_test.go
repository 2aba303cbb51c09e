package e2e

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// evictionPath matches POST .../namespaces/<ns>/pods/<name>/eviction.
var evictionPath = regexp.MustCompile(`/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$`)

// apiProxy sits between nodeguard and kube-apiserver and watches the eviction
// requests: how many are in flight per workload (the pod name's Deployment
// prefix), the most ever in flight, and each workload's answers in order.
type apiProxy struct {
	url        string
	kubeconfig string
	// onFirstEviction, if set, runs before the first eviction is forwarded.
	onFirstEviction func()

	mu       sync.Mutex
	podLists map[string]int // by field selector
	inFlight map[string]int
	maxInFl  map[string]int
	answers  map[string][]int
}

func startAPIProxy(t *testing.T) *apiProxy {
	t.Helper()
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{podLists: map[string]int{}, inFlight: map[string]int{}, maxInFl: map[string]int{}, answers: map[string][]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // stream watches
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := evictionPath.FindStringSubmatch(r.URL.Path)
		if r.Method != http.MethodPost || m == nil {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "" {
				p.mu.Lock()
				p.podLists[r.URL.Query().Get("fieldSelector")]++
				p.mu.Unlock()
			}
			rp.ServeHTTP(w, r)
			return
		}
		workload := workloadOf(m[2])
		if p.onFirstEviction != nil {
			p.onFirstEviction()
		}
		p.begin(workload)
		// The eviction is out of flight when its answer starts back: a client
		// that has read the answer may send the next one at once, and that one
		// must not count as overlapping this one.
		rec := &answerStart{ResponseWriter: w, started: func(status int) { p.end(workload, status) }}
		// An eviction that reached the proxy completes even if nodeguard is
		// killed meanwhile. Cancelled half-way, kube-apiserver may charge the
		// PDB without deleting the pod, which blocks that PDB for its 2-minute
		// disruptedPods timeout (seen here): real, but not nodeguard's doing.
		rp.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		rec.WriteHeader(http.StatusBadGateway) // a no-op unless nothing answered
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	p.url = "http://" + l.Addr().String()
	p.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: " + p.url +
		"\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\nusers:\n- name: proxy\n  user: {}\n"
	if err := os.WriteFile(p.kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// workloadOf turns a Deployment pod name (app-<hash>-<id>) into "app".
func workloadOf(pod string) string {
	parts := strings.Split(pod, "-")
	if len(parts) < 3 {
		return pod
	}
	return strings.Join(parts[:len(parts)-2], "-")
}

func (p *apiProxy) begin(workload string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight[workload]++
	p.maxInFl[workload] = max(p.maxInFl[workload], p.inFlight[workload])
}

func (p *apiProxy) end(workload string, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight[workload]--
	p.answers[workload] = append(p.answers[workload], status)
}

// podListsOf counts the LISTs of a node's pods (one per drain pass).
func (p *apiProxy) podListsOf(node string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.podLists["spec.nodeName="+node]
}

// maxInFlight is the most eviction requests ever in flight for a workload.
func (p *apiProxy) maxInFlight(workload string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxInFl[workload]
}

// evictionAnswers are a workload's eviction answers (HTTP status) in order.
func (p *apiProxy) evictionAnswers(workload string) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.answers[workload]...)
}

// answerStart calls started with the status just before the answer's first
// byte goes back to the client, once.
type answerStart struct {
	http.ResponseWriter
	started func(status int)
	once    sync.Once
}

func (a *answerStart) WriteHeader(code int) {
	a.once.Do(func() {
		a.started(code)
		a.ResponseWriter.WriteHeader(code)
	})
}

func (a *answerStart) Write(b []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.ResponseWriter.Write(b)
}

func (a *answerStart) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
