package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Admission modes: nodeguard's handlers, or a no-op webhook at the same
// registrations (same apiserver path, TLS and JSON, no decision work).
const (
	modeNoop      = "no-op webhook"
	modeNodeguard = "nodeguard"
)

var admissionOps = []string{"CREATE", "UPDATE", "DELETE", "DELETE, 1 client", opEviction}

// opEviction is the eviction of a pod from a schedulable node: the common
// path of the eviction webhook (a pod locator lookup and one read of the node
// from the API server, no write).
const opEviction = "pod EVICTION, schedulable node"

type admitResult struct {
	Clients int                                   `json:"clients"`
	Latency map[string]map[string]bench.Summary   `json:"latency"` // mode -> op -> summary
	Denied  map[string]int                        `json:"deleteDenied"`
	NoopHit int64                                 `json:"noopRequests"`
	Raw     map[string]map[string][]time.Duration `json:"raw"`
	// Handler is nodeguard's own time in its handlers over the measured
	// rounds, by webhook path (controller-runtime's webhook latency).
	Handler map[string]histogram `json:"handlerLatency,omitempty"`
}

// nodeguard's own histograms of its handlers' time, for the node DELETEs and
// the evictions it admits (controller-runtime's webhook histogram has one
// bucket per decade).
const (
	nodeDeleteHandler  = `nodeguard_admission_duration_seconds{operation="DELETE"}`
	podEvictionHandler = `nodeguard_eviction_admission_duration_seconds{result="allowed"}`
	// The DELETE handler's claim, and the status write of a claim round.
	claimMetric       = "nodeguard_ndb_claim_duration_seconds"
	statusWriteMetric = "nodeguard_ndb_status_write_duration_seconds"
)

// noopWebhook answers every AdmissionReview with "allowed", no patch.
type noopWebhook struct {
	url  string
	srv  *http.Server
	hits atomic.Int64
}

func startNoopWebhook(env *harness.Env) (*noopWebhook, error) {
	dir := env.Webhook.LocalServingCertDir
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, err
	}
	l, err := tls.Listen("tcp", net.JoinHostPort(env.Webhook.LocalServingHost, "0"),
		&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	if err != nil {
		return nil, err
	}
	w := &noopWebhook{}
	w.srv = &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.hits.Add(1)
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(rw, "bad review", http.StatusBadRequest)
			return
		}
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(review)
	})}
	go func() { _ = w.srv.Serve(l) }()
	w.url = "https://" + l.Addr().String()
	return w, nil
}

// pointWebhooks points both of nodeguard's webhook registrations at base
// (scheme://host:port), keeping each path; it returns the previous base.
func pointWebhooks(ctx context.Context, cl client.Client, base string) (string, error) {
	var prev string
	swap := func(cc *admissionregistrationv1.WebhookClientConfig) error {
		if cc.URL == nil {
			return errors.New("webhook has no URL")
		}
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return err
		}
		prev = u.Scheme + "://" + u.Host
		b, _ := url.Parse(base)
		u.Scheme, u.Host = b.Scheme, b.Host
		s := u.String()
		cc.URL = &s
		return nil
	}
	var m admissionregistrationv1.MutatingWebhookConfiguration
	if err := cl.Get(ctx, client.ObjectKey{Name: "mutating-webhook-configuration"}, &m); err != nil {
		return "", err
	}
	for i := range m.Webhooks {
		if err := swap(&m.Webhooks[i].ClientConfig); err != nil {
			return "", err
		}
	}
	if err := cl.Update(ctx, &m); err != nil {
		return "", err
	}
	var v admissionregistrationv1.ValidatingWebhookConfiguration
	if err := cl.Get(ctx, client.ObjectKey{Name: "validating-webhook-configuration"}, &v); err != nil {
		return "", err
	}
	for i := range v.Webhooks {
		if err := swap(&v.Webhooks[i].ClientConfig); err != nil {
			return "", err
		}
	}
	return prev, cl.Update(ctx, &v)
}

// runAdmission times node CREATE, UPDATE (a label patch) and DELETE (with
// the NodeDisruptionBudget claim) from concurrent clients through the real
// apiserver, alternating nodeguard's webhooks and a no-op webhook.
func runAdmission(ctx context.Context, c config, env *harness.Env) (*admitResult, error) {
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	ng, err := startNodeguard(c.nodeguard, env, env.Kubeconfig, "", filepath.Join(env.Dir, "nodeguard-admission.log"),
		"--metrics-bind-address="+metricsAddr, "--metrics-secure=false")
	if err != nil {
		return nil, err
	}
	defer ng.stop()
	metricsURL := "http://" + metricsAddr + "/metrics"
	handlerMetrics := []string{nodeDeleteHandler, podEvictionHandler, claimMetric, statusWriteMetric}
	var handlerBefore map[string]histogram
	noop, err := startNoopWebhook(env)
	if err != nil {
		return nil, err
	}
	defer noop.srv.Close()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 10000, 10000
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	// Every admitted delete claims one disruption of this budget.
	if err := create(ctx, cl, builder.NDB("bench-admission", builder.NDBSelecting("bench", "admission"), builder.NDBMaxUnavailable("100%"))); err != nil {
		return nil, err
	}
	r := &admitResult{Clients: c.admissionConc, Latency: map[string]map[string]bench.Summary{}, Denied: map[string]int{},
		Raw: map[string]map[string][]time.Duration{modeNoop: {}, modeNodeguard: {}}}
	ngBase := ""
	seq := 0
	// A warm-up phase in each mode, then the measured rounds in alternating
	// order, so that drift on the shared machine hits both modes alike.
	plan := [][]string{{modeNoop, modeNodeguard}}
	for round := range c.admissionRound {
		if round%2 == 0 {
			plan = append(plan, []string{modeNodeguard, modeNoop})
		} else {
			plan = append(plan, []string{modeNoop, modeNodeguard})
		}
	}
	for round, modes := range plan {
		for _, mode := range modes {
			if mode == modeNoop {
				prev, err := pointWebhooks(ctx, env.Client, noop.url)
				if err != nil {
					return nil, err
				}
				if ngBase == "" {
					ngBase = prev // where envtest pointed them: nodeguard
				}
			} else if ngBase != "" {
				if _, err := pointWebhooks(ctx, env.Client, ngBase); err != nil {
					return nil, err
				}
			}
			time.Sleep(2 * time.Second) // the apiserver picks up the registration change
			if round == 1 && handlerBefore == nil {
				if handlerBefore, err = scrapeHistograms(ctx, metricsURL, handlerMetrics...); err != nil {
					return nil, err
				}
			}
			n := c.admissionN
			if round == 0 {
				n = 10
				logf("admission: warm-up, %s", mode)
			} else {
				logf("admission: round %d, %s, %d nodes × CREATE/UPDATE/DELETE, %d clients", round, mode, c.admissionN, c.admissionConc)
			}
			var names []string
			for range n {
				names = append(names, "admit-"+strconv.Itoa(seq))
				seq++
			}
			hits0 := noop.hits.Load()
			lat, denied, err := admissionPhase(ctx, cl, names, c.admissionConc, mode == modeNodeguard)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			if mode == modeNoop {
				r.NoopHit += noop.hits.Load() - hits0
			} else if hits := noop.hits.Load() - hits0; hits > 0 {
				return nil, fmt.Errorf("the no-op webhook got %d requests while nodeguard's should have", hits)
			}
			if round == 0 {
				continue
			}
			r.Denied[mode] += denied
			for op, ds := range lat {
				r.Raw[mode][op] = append(r.Raw[mode][op], ds...)
			}
			// Let nodeguard release the deleted nodes before the next phase.
			_ = harness.Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
				var nodes corev1.NodeList
				err := cl.List(ctx, &nodes, client.MatchingLabels{"bench": "admission"})
				return err == nil && len(nodes.Items) == 0, nil
			})
		}
	}
	if ngBase != "" {
		if _, err := pointWebhooks(ctx, env.Client, ngBase); err != nil {
			return nil, err
		}
	}
	if after, err := scrapeHistograms(ctx, metricsURL, handlerMetrics...); err == nil && handlerBefore != nil {
		r.Handler = map[string]histogram{}
		for _, m := range handlerMetrics {
			r.Handler[m] = after[m].since(handlerBefore[m])
		}
	}
	for mode, byOp := range r.Raw {
		r.Latency[mode] = map[string]bench.Summary{}
		for op, ds := range byOp {
			r.Latency[mode][op] = bench.Summarize(ds)
		}
	}
	return r, nil
}

// admissionPhase creates, updates and deletes the nodes, each step from
// `clients` goroutines, timing every call. With guarded, it waits before the
// deletes until the budget counts every node, and retries denied deletes
// (counted) after a short pause.
func admissionPhase(ctx context.Context, cl client.Client, names []string, clients int, guarded bool) (map[string][]time.Duration, int, error) {
	lat := map[string][]time.Duration{}
	var mu sync.Mutex
	var denied atomic.Int64
	timed := func(op string, fn func() error) error {
		start := time.Now()
		err := fn()
		d := time.Since(start)
		if err == nil {
			mu.Lock()
			lat[op] = append(lat[op], d)
			mu.Unlock()
		}
		return err
	}
	err := forEach(ctx, names, clients, func(ctx context.Context, n string) error {
		node := builder.Node(n, builder.WithLabels("bench", "admission", managedLabel, "true"), builder.Ready())
		delete(node.Annotations, builder.KwokAnnotation) // no kwok heartbeats: less background load
		return timed("CREATE", func() error { return cl.Create(ctx, node) })
	})
	if err != nil {
		return nil, 0, err
	}
	err = forEach(ctx, names, clients, func(ctx context.Context, n string) error {
		node := &corev1.Node{}
		node.Name = n
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"bench.nodeguard.io/updated":"true"}}}`))
		return timed("UPDATE", func() error { return cl.Patch(ctx, node, patch) })
	})
	if err != nil {
		return nil, 0, err
	}
	if err := evictionPhase(ctx, cl, names, clients, timed); err != nil {
		return nil, 0, err
	}
	if guarded {
		if err := harness.Poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
			var ndb ngv1alpha1.NodeDisruptionBudget
			err := cl.Get(ctx, client.ObjectKey{Name: "bench-admission"}, &ndb)
			return err == nil && int(ndb.Status.DisruptionsAllowed) >= len(names), err
		}); err != nil {
			return nil, 0, fmt.Errorf("waiting for the budget to count %d nodes: %w", len(names), err)
		}
		for _, n := range names {
			if err := waitFinalizer(ctx, cl, n); err != nil {
				return nil, 0, err
			}
		}
	}
	deleteNode := deleteNodeWith(cl, timed, &denied)
	// A fifth of the deletes one at a time (no conflicts on the budget), the
	// rest from every client at once.
	serial := len(names) / 5
	err = forEach(ctx, names[:serial], 1, deleteNode("DELETE, 1 client"))
	if err == nil {
		err = forEach(ctx, names[serial:], clients, deleteNode("DELETE"))
	}
	return lat, int(denied.Load()), err
}

// evictionPhase binds a pod to each node (untimed), then evicts each (timed)
// with a zero grace period, so that no kubelet is waited for: the nodes are
// schedulable, so nodeguard decides from memory.
func evictionPhase(ctx context.Context, cl client.Client, names []string, clients int, timed func(string, func() error) error) error {
	pod := func(n string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "evict-" + n},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	}
	if err := forEach(ctx, names, clients, func(ctx context.Context, n string) error { return cl.Create(ctx, pod(n)) }); err != nil {
		return err
	}
	return forEach(ctx, names, clients, func(ctx context.Context, n string) error {
		p := pod(n)
		e := &policyv1.Eviction{ObjectMeta: p.ObjectMeta, DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}}
		return timed(opEviction, func() error { return cl.SubResource("eviction").Create(ctx, p, e) })
	})
}

func deleteNodeWith(cl client.Client, timed func(string, func() error) error, denied *atomic.Int64) func(string) func(context.Context, string) error {
	return func(op string) func(context.Context, string) error {
		return func(ctx context.Context, n string) error {
			for range 20 {
				node := &corev1.Node{}
				node.Name = n
				err := timed(op, func() error { return cl.Delete(ctx, node) })
				if apierrors.IsTooManyRequests(err) || apierrors.IsForbidden(err) {
					denied.Add(1)
					time.Sleep(200 * time.Millisecond)
					continue
				}
				return client.IgnoreNotFound(err)
			}
			return fmt.Errorf("deleting node %s: denied 20 times", n)
		}
	}
}

func admissionTable(r *admitResult) *bench.Table {
	if r == nil {
		return nil
	}
	t := &bench.Table{
		Title:  fmt.Sprintf("3. Admission latency through kube-apiserver (%d concurrent clients): nodeguard vs a no-op webhook", r.Clients),
		Header: []string{"operation", "no-op p50", "no-op p99", "nodeguard p50", "nodeguard p99", "ratio p50", "ratio p99", "n"},
	}
	for _, op := range admissionOps {
		a, b := r.Latency[modeNoop][op], r.Latency[modeNodeguard][op]
		name := "node " + op
		if op == opEviction {
			name = op
		}
		t.AddRow(name, bench.Millis(a.P50), bench.Millis(a.P99), bench.Millis(b.P50), bench.Millis(b.P99),
			bench.Times(bench.Ratio(b.P50, a.P50)), bench.Times(bench.Ratio(b.P99, a.P99)), fmt.Sprintf("%d / %d", a.N, b.N))
	}
	t.Note("Client-side time of the API call; both modes use the same registrations (same apiserver path, TLS, timeouts): only the handler differs. CREATE gets the finalizer patch; DELETE is admitted after the maintenance-Lease check and a conditional status write claiming one disruption of a NodeDisruptionBudget that selects every benchmark node (maxUnavailable 100%%): concurrent deletes join one status write per round (group commit), and the deletes' drains make the status controller write the same budget.")
	t.Note("How to read it: a ratio is nodeguard's latency over the no-op webhook's at the same percentile, from the same run; the target for DELETE with %d clients is p50 ≤ 1.5× and p99 ≤ 2×; for an eviction from a schedulable node (a pod bound to each benchmark node, evicted with a zero grace period) p99 ≤ 1.5×.", r.Clients)
	t.Note("Denied deletes (retried; not in the latencies): %d with nodeguard, %d with the no-op webhook.", r.Denied[modeNodeguard], r.Denied[modeNoop])
	if len(r.Handler) > 0 {
		t.Note("Where nodeguard's time goes: its own handlers, from its histograms over the measured rounds (bucket bounds): node DELETE (%s: the Lease check, the budget claim and its status write) %s; an admitted eviction (%s) %s. The rest of each latency is kube-apiserver's: the webhook call, and the writes of the drains that admitted deletes start on the same 2 cores.",
			nodeDeleteHandler, r.Handler[nodeDeleteHandler].summary(), podEvictionHandler, r.Handler[podEvictionHandler].summary())
	}
	if claim, write := r.Handler[claimMetric], r.Handler[statusWriteMetric]; claim.count() > 0 && write.count() > 0 {
		t.Note("A claim (the DELETEs') or release (the drains'), from joining its budget's group commit to its verdict (%s): %s; the status write of one round (%s), the drains' releases and recomputations included: %s. A claim waits for the round in flight, then its own: an admitted DELETE costs at least one status write more than the no-op's.",
			claimMetric, claim.summary(), statusWriteMetric, write.summary())
	}
	return t
}
