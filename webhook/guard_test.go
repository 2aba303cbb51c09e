package webhook_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

var (
	env   *harness.Env
	front *harness.WebhookFront // where the installed webhook configurations point
)

func TestMain(m *testing.M) {
	harness.Main(m, harness.Options{WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")}}, &env)
}

// guard is one nodeguard instance in the test process: the webhooks and the
// budget status controller, optionally the finalizer backfill.
type guard struct {
	addr string
	stop func()
	// answers counts the admission reviews this guard's webhook server answered.
	answers *answerCounter
	// cache is the guard's cached client: what its webhooks read.
	cache client.Reader
}

func startGuard(t *testing.T, backfill bool) *guard {
	t.Helper()
	return startNodeguard(t, true, backfill)
}

// startReplica starts a guard that serves the webhooks only, as a nodeguard
// replica that is not the leader does: the status controller and the
// backfill run on the leader alone (controller-runtime's leader election).
func startReplica(t *testing.T) *guard {
	t.Helper()
	return startNodeguard(t, false, false)
}

func startNodeguard(t *testing.T, leader, backfill bool) *guard {
	t.Helper()
	mgr, addr, answers := newManager(t)
	setupGuard(t, mgr, leader, backfill, nil)
	return run(t, mgr, addr, answers)
}

// setupGuard registers on mgr what a nodeguard replica runs: the webhooks, and
// on the leader the budget status controller (tuned by tune, if set) and
// optionally the backfill.
func setupGuard(t *testing.T, mgr ctrl.Manager, leader, backfill bool, tune func(*budget.StatusReconciler)) {
	t.Helper()
	// One claimer for the webhook and the status controller, as cmd/nodeguard wires them.
	claimer := budget.NewClaimer(mgr, nil)
	if err := ngwebhook.Register(mgr, ngwebhook.Options{Managed: labels.Everything(), DeleteTimeout: ngwebhook.DefaultDeleteTimeout,
		Rules: doorRules(mgr, claimer, nil)}); err != nil {
		t.Fatal(err)
	}
	if !leader {
		return
	}
	status := &budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout,
		Claimer: claimer}
	if tune != nil {
		tune(status)
	}
	if err := status.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if backfill {
		if err := ngwebhook.SetupBackfill(mgr, labels.Everything()); err != nil {
			t.Fatal(err)
		}
	}
}

// doorRules builds the doors' rules once, as cmd/nodeguard does, over claimer
// (nil: one of their own): the deletion rule reads maintenance Leases fresh,
// the drain rule none.
func doorRules(mgr ctrl.Manager, claimer *budget.Claimer, instances budget.InstanceChecker) budget.Rules {
	if claimer == nil {
		claimer = budget.NewClaimer(mgr, nil)
	}
	return budget.NewRules(claimer, mgr.GetAPIReader(), instances, clock.RealClock{})
}

// newManager makes a manager whose webhook server listens on a free local port
// with the certificate the installed webhook configurations trust. It serves
// HTTP/1.1 only, as cmd/nodeguard does: kube-apiserver then opens a connection
// per concurrent call instead of multiplexing them all over one HTTP/2
// connection, so the front proxy spreads calls over several guards. Every
// review the server answers is counted.
func newManager(t *testing.T) (ctrl.Manager, string, *answerCounter) {
	t.Helper()
	return newManagerFor(t, env.Config)
}

// newManagerFor is newManager with the manager's own client configuration.
func newManagerFor(t *testing.T, cfg *rest.Config) (ctrl.Manager, string, *answerCounter) {
	t.Helper()
	port := harness.FreePort(t)
	answers := &answerCounter{}
	server := &countingServer{Server: webhook.NewServer(webhook.Options{
		Host: "127.0.0.1", Port: port, CertDir: env.Webhook.LocalServingCertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}), answers: answers}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          server,
		// Several guards run in one test process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return mgr, fmt.Sprintf("127.0.0.1:%d", port), answers
}

// countingServer is a webhook server whose hooks count what they answer.
type countingServer struct {
	webhook.Server
	answers *answerCounter
}

func (s *countingServer) Register(path string, hook http.Handler) {
	s.Server.Register(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &reviewRecorder{ResponseWriter: w}
		hook.ServeHTTP(rec, r)
		s.answers.add(path, rec.allowed())
	}))
}

// answerCounter counts answered admission reviews by webhook path.
type answerCounter struct {
	mu      sync.Mutex
	total   map[string]int
	allowed map[string]int
}

func (c *answerCounter) add(path string, allowed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total == nil {
		c.total, c.allowed = map[string]int{}, map[string]int{}
	}
	c.total[path]++
	if allowed {
		c.allowed[path]++
	}
}

// counts returns how many reviews at path were answered, and how many allowed.
func (c *answerCounter) counts(path string) (total, allowed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total[path], c.allowed[path]
}

// reviewRecorder keeps the AdmissionReview a hook writes.
type reviewRecorder struct {
	http.ResponseWriter
	body []byte
}

func (r *reviewRecorder) Write(b []byte) (int, error) {
	r.body = append(r.body, b...)
	return r.ResponseWriter.Write(b)
}

func (r *reviewRecorder) allowed() bool {
	var review admissionv1.AdmissionReview
	return json.Unmarshal(r.body, &review) == nil && review.Response != nil && review.Response.Allowed
}

// run starts the manager, waits until its webhook server serves, and stops it
// when the test ends.
func run(t *testing.T, mgr ctrl.Manager, addr string, answers *answerCounter) *guard {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	checker := mgr.GetWebhookServer().StartedChecker()
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return checker(nil) == nil, nil
	}, "the webhook server serves")
	g := &guard{addr: addr, answers: answers, cache: mgr.GetClient()}
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("guard stopped with error: %v", err)
			}
		})
	}
	t.Cleanup(g.stop)
	return g
}

// useGuards points the installed webhook configurations at the given guards
// (round robin), starting the front on first use.
func useGuards(t *testing.T, guards ...*guard) {
	t.Helper()
	if front == nil {
		f, err := harness.StartWebhookFront(env.WebhookAddr())
		if err != nil {
			t.Fatal(err)
		}
		front = f
	}
	var addrs []string
	for _, g := range guards {
		addrs = append(addrs, g.addr)
	}
	front.SetBackends(addrs...)
	t.Cleanup(func() { front.SetBackends() })
}

// createReadyNodes creates Ready nodes named prefix-0..n-1 with the label pool=prefix.
func createReadyNodes(t *testing.T, prefix string, n int, opts ...builder.NodeOption) []string {
	t.Helper()
	names := make([]string, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := builder.Node(names[i], append([]builder.NodeOption{builder.WithLabels("pool", prefix), builder.Ready()}, opts...)...)
			errs[i] = env.Client.Create(context.Background(), node)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return names
}

// createBudget creates an NDB over pool=name and waits until its status is computed.
func createBudget(t *testing.T, name string, wantAllowed int32, opts ...builder.NDBOption) *ngv1alpha1.NodeDisruptionBudget {
	t.Helper()
	ndb := builder.NDB(name, append([]builder.NDBOption{builder.NDBSelecting("pool", name)}, opts...)...)
	if err := env.Client.Create(context.Background(), ndb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(ndb), ndb)
		return err == nil && ndb.Status.ObservedGeneration == ndb.Generation && ndb.Status.DisruptionsAllowed == wantAllowed, err
	}, "NodeDisruptionBudget %s allows %d disruptions", name, wantAllowed)
	return ndb
}

// TestWebhookServerAnswersMalformedReviews posts malformed AdmissionReviews to
// a running webhook server: each gets a clear error, none crashes it.
func TestWebhookServerAnswersMalformedReviews(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	g := startGuard(t, false)
	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // test server
	post := func(body string) (int, string) {
		resp, err := httpClient.Post("https://"+g.addr+ngwebhook.DeletePath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("webhook server unreachable: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	review := func(request string) string {
		return `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":` + request + `}`
	}
	tests := []struct{ name, body, want string }{
		{"garbage JSON", `{"apiVersion":`, `"code":400`},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, `unexpected operation \"\": this webhook admits Node DELETE only`},
		{"missing oldObject", review(`{"uid":"1","operation":"DELETE","name":"x"}`), `admission request has no oldObject`},
		{"wrong kind", review(`{"uid":"2","operation":"DELETE","oldObject":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}}`), `oldObject is a v1 Pod, not a v1 Node`},
		{"body over 7 MiB", review(`{"uid":"3","operation":"DELETE","oldObject":{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + strings.Repeat("n", 8<<20) + `"}}}`), `request entity is too large`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(tt.body)
			if code != http.StatusOK || !strings.Contains(body, tt.want) || strings.Contains(body, `"allowed":true`) {
				t.Fatalf("HTTP %d %s, want a denied review containing %q", code, body, tt.want)
			}
		})
	}
	// Still serving: a well-formed review of an unmanaged-by-any-budget node is answered.
	code, body := post(review(`{"uid":"4","operation":"DELETE","oldObject":{"apiVersion":"v1","kind":"Node","metadata":{"name":"x","deletionTimestamp":"2026-11-21T10:00:00Z"}}}`))
	if code != http.StatusOK || !strings.Contains(body, `"allowed":true`) {
		t.Fatalf("after malformed reviews: HTTP %d %s", code, body)
	}
}

// startExperiment serves, at both webhook paths, a handler that adds the
// termination finalizer by an API patch during DELETE admission and allows.
func startExperiment(t *testing.T) *guard {
	t.Helper()
	mgr, addr, answers := newManager(t)
	allow := webhook.Admission{Handler: admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		if req.Operation == admissionv1.Delete {
			patch := []byte(`{"metadata":{"finalizers":["` + ngv1alpha1.TerminationFinalizer + `"]}}`)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: req.Name}}
			if err := env.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
				return admission.Errored(http.StatusInternalServerError, err)
			}
		}
		return admission.Allowed("")
	})}
	mgr.GetWebhookServer().Register(ngwebhook.FinalizerPath, &webhook.Admission{Handler: admission.HandlerFunc(
		func(context.Context, admission.Request) admission.Response { return admission.Allowed("") })})
	mgr.GetWebhookServer().Register(ngwebhook.DeletePath, &allow)
	return run(t, mgr, addr, answers)
}
