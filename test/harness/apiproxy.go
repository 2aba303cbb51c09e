package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// evictionPath matches POST .../namespaces/<ns>/pods/<name>/eviction.
var evictionPath = regexp.MustCompile(`/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$`)

// Eviction is one eviction request that went through an APIProxy.
type Eviction struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// Workload is the pod's Deployment (the name without its two last parts).
	Workload string    `json:"workload"`
	Start    time.Time `json:"start"`
	// End is when the answer started back: a client that has read it may send
	// its next request before the proxy is done copying.
	End    time.Time `json:"end"`
	Status int       `json:"status"`
}

// Write is one write request (POST, PUT, PATCH, DELETE) that went through an
// APIProxy, evictions included.
type Write struct {
	Method string `json:"method"`
	// Path is the URL path, e.g. /api/v1/namespaces/ns/pods/web-1/eviction.
	Path   string `json:"path"`
	Status int    `json:"status"`
	// Body is the request's body when it wrote a status subresource (a
	// status patch is small), for a test to read what changed.
	Body []byte `json:"body,omitempty"`
}

// maxRecordedBody bounds the status write bodies a proxy keeps.
const maxRecordedBody = 64 << 10

// APIProxy sits between a client (nodeguard, kubectl) and kube-apiserver and
// records what a drain does through it: every eviction request, the most ever
// in flight at once per workload (from a request's start to the first byte of
// its answer), and every write request.
type APIProxy struct {
	// Kubeconfig points a client at the proxy, as the cluster admin.
	Kubeconfig string

	srv     *http.Server
	onFirst func()

	mu       sync.Mutex
	evicting bool
	inFlight map[string]int // by namespace/workload
	maxInFl  map[string]int
	log      []Eviction
	writes   []Write
}

// StartAPIProxy starts a proxy to the control plane, with a kubeconfig for it
// written to kubeconfigPath. An eviction that reached the proxy completes even
// if its client is killed meanwhile: cancelled half-way, kube-apiserver may
// charge the PDB without deleting the pod, blocking that PDB for its 2-minute
// disruptedPods timeout (seen here): real, but no drainer's doing.
func StartAPIProxy(cfg *rest.Config, kubeconfigPath string) (*APIProxy, error) {
	p := &APIProxy{Kubeconfig: kubeconfigPath, inFlight: map[string]int{}, maxInFl: map[string]int{}}
	srv, err := ServeAPIProxy(cfg, kubeconfigPath, func(rp *httputil.ReverseProxy) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				body := recordStatusBody(r)
				w = &answerStart{ResponseWriter: w, started: func(status int) {
					p.mu.Lock()
					defer p.mu.Unlock()
					p.writes = append(p.writes, Write{Method: r.Method, Path: r.URL.Path, Status: status, Body: body})
				}}
			}
			if m := evictionPath.FindStringSubmatch(r.URL.Path); r.Method == http.MethodPost && m != nil {
				p.evict(rp, w, r, m[1], m[2])
				return
			}
			rp.ServeHTTP(w, r)
		})
	})
	if err != nil {
		return nil, err
	}
	p.srv = srv
	return p, nil
}

// recordStatusBody returns the body of a status subresource write.
func recordStatusBody(r *http.Request) []byte {
	if !strings.HasSuffix(r.URL.Path, "/status") {
		return nil
	}
	body, err := PeekBody(r, maxRecordedBody)
	if err != nil {
		return nil
	}
	return body
}

// PeekBody reads up to limit bytes of a request's body, for a proxy to look
// at before it forwards the request, and puts them back ahead of the rest.
func PeekBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	rest := r.Body
	body, err := io.ReadAll(io.LimitReader(rest, limit))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	return body, err
}

// PatchedCondition is one entry of a strategic merge patch of a node's
// conditions, as nodeguard writes them: a condition set, or with Patch
// "delete" a type removed.
type PatchedCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Patch   string `json:"$patch"`
}

// PatchedConditions reads the conditions a node status patch writes.
func PatchedConditions(body []byte) ([]PatchedCondition, error) {
	var patch struct {
		Status struct {
			Conditions []PatchedCondition `json:"conditions"`
		} `json:"status"`
	}
	err := json.Unmarshal(body, &patch)
	return patch.Status.Conditions, err
}

// ServeAPIProxy serves handler on a local port, in front of the control plane
// of cfg: rp forwards a request there with cfg's credentials (watches
// streamed). It writes a kubeconfig for the proxy to kubeconfigPath; close the
// server to stop it.
func ServeAPIProxy(cfg *rest.Config, kubeconfigPath string, handler func(rp *httputil.ReverseProxy) http.Handler) (*http.Server, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // stream watches
	direct := rp.Director
	rp.Director = func(r *http.Request) {
		direct(r)
		r.Header.Del("Authorization") // the kubeconfig's placeholder: cfg's credentials go instead
	}
	tlsConfig, caPEM, err := proxyTLS()
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: handler(rp), TLSConfig: tlsConfig,
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: apiServerStreams}}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	if err := writeProxyKubeconfig(kubeconfigPath, l.Addr().String(), caPEM); err != nil {
		_ = srv.Close()
		return nil, err
	}
	return srv, nil
}

// apiServerStreams is kube-apiserver's default
// --http2-max-streams-per-connection.
const apiServerStreams = 1000

// proxyTLS is the proxy's TLS configuration, with a self-signed certificate
// for 127.0.0.1, and that certificate in PEM for its kubeconfig. Over TLS its
// clients speak HTTP/2, as they do to kube-apiserver: all their requests and
// watches share one connection. Over plain HTTP each request in flight took
// a connection of its own, whose buffers and goroutines counted in the
// memory of the drainer measured.
func proxyTLS() (*tls.Config, []byte, error) {
	key, cert, err := NewCertificate(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "nodeguard test API proxy"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	pair := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, caPEM, nil
}

// OnFirstEviction sets a function that runs before the first eviction is
// forwarded.
func (p *APIProxy) OnFirstEviction(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onFirst = f
}

// Close stops the proxy.
func (p *APIProxy) Close() { _ = p.srv.Close() }

func (p *APIProxy) evict(rp *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request, ns, pod string) {
	p.mu.Lock()
	first := !p.evicting
	p.evicting = true
	onFirst := p.onFirst
	p.mu.Unlock()
	if first && onFirst != nil {
		onFirst()
	}
	e := Eviction{Namespace: ns, Pod: pod, Workload: workloadOf(pod), Start: time.Now()}
	key := ns + "/" + e.Workload
	p.mu.Lock()
	p.inFlight[key]++
	p.maxInFl[key] = max(p.maxInFl[key], p.inFlight[key])
	p.mu.Unlock()
	answer := &answerStart{ResponseWriter: w, started: func(status int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		e.End, e.Status = time.Now(), status
		p.inFlight[key]--
		p.log = append(p.log, e)
	}}
	rp.ServeHTTP(answer, r.WithContext(context.WithoutCancel(r.Context())))
	answer.WriteHeader(http.StatusBadGateway) // a no-op unless nothing answered
}

// workloadOf turns a Deployment pod name (app-<hash>-<id>) into "app".
func workloadOf(pod string) string {
	parts := strings.Split(pod, "-")
	if len(parts) < 3 {
		return pod
	}
	return strings.Join(parts[:len(parts)-2], "-")
}

// Evictions are the answered eviction requests of a namespace ("" for all),
// in the order their answers started.
func (p *APIProxy) Evictions(namespace string) []Eviction {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Eviction
	for _, e := range p.log {
		if namespace == "" || e.Namespace == namespace {
			out = append(out, e)
		}
	}
	return out
}

// Answers are the HTTP statuses of a workload's eviction requests, in order.
func (p *APIProxy) Answers(namespace, workload string) []int {
	var out []int
	for _, e := range p.Evictions(namespace) {
		if e.Workload == workload {
			out = append(out, e.Status)
		}
	}
	return out
}

// MaxInFlight is the most eviction requests of a workload ever in flight at
// once.
func (p *APIProxy) MaxInFlight(namespace, workload string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxInFl[namespace+"/"+workload]
}

// Writes are the answered write requests whose path starts with prefix
// (method "" for any), in the order their answers started. A pod's prefix,
// /api/v1/namespaces/<ns>/pods/<name>, covers its deletion and its eviction.
func (p *APIProxy) Writes(method, prefix string) []Write {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Write
	for _, w := range p.writes {
		if (method == "" || w.Method == method) && strings.HasPrefix(w.Path, prefix) {
			out = append(out, w)
		}
	}
	return out
}

// OnAnswer wraps w so that started is called with the status just before the
// answer's first byte goes back to the client, once: for a proxy handler that
// records answers.
func OnAnswer(w http.ResponseWriter, started func(status int)) http.ResponseWriter {
	return &answerStart{ResponseWriter: w, started: started}
}

// answerStart is OnAnswer's writer.
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

// writeProxyKubeconfig writes a kubeconfig that reaches the API server through
// the proxy listening on addr, over TLS with the proxy's own certificate. The
// proxy holds the credentials: kubectl asks for a password against an HTTPS
// server with none, so the user has a placeholder token, which the proxy drops.
func writeProxyKubeconfig(path, addr string, caPEM []byte) error {
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: https://" + addr +
		"\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString(caPEM) +
		"\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\nusers:\n- name: proxy\n  user:\n    token: proxy\n"
	return os.WriteFile(path, []byte(kc), 0o600)
}
