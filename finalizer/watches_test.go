package finalizer

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// These tests run the termination controller in a manager, as nodeguard
// does, with a drain backstop of an hour: whatever happens in them happened
// because a watch said so, never because a poll came round.

// apiLog records the requests the controller sends, as "verb resource
// detail" lines: "list pods spec.nodeName=n", "watch volumeattachments",
// "evict ns/name", "get node n" (a pass's fresh read of its node: every pass
// but a draining node's, which reads the cache).
type apiLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
	// held is a request line that waits until its channel closes.
	held     string
	released chan struct{}
}

func (l *apiLog) RoundTrip(req *http.Request) (*http.Response, error) {
	if line := describe(req); line != "" {
		l.mu.Lock()
		l.seen = append(l.seen, line)
		if strings.HasPrefix(line, "list pods ") && req.URL.Query().Get("resourceVersionMatch") == "NotOlderThan" && req.URL.Query().Get("resourceVersion") != "" {
			l.seen = append(l.seen, line+" notOlderThan") // as well: served from the watch cache
		}
		var wait chan struct{}
		if line == l.held {
			wait = l.released
		}
		l.mu.Unlock()
		if wait != nil {
			<-wait
		}
	}
	return l.next.RoundTrip(req)
}

// hold makes the request line wait (it is logged at once) until release.
func (l *apiLog) hold(line string) (release func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held, l.released = line, make(chan struct{})
	var once sync.Once
	ch := l.released
	return func() { once.Do(func() { close(ch) }) }
}

func describe(req *http.Request) string {
	path, q := req.URL.Path, req.URL.Query()
	verb := "list"
	if q.Get("watch") == "true" {
		verb = "watch"
	}
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(path, "/eviction"):
		parts := strings.Split(path, "/") // /api/v1/namespaces/<ns>/pods/<name>/eviction
		return "evict " + parts[4] + "/" + parts[6]
	case req.Method == http.MethodGet && path == "/api/v1/pods":
		return verb + " pods " + q.Get("fieldSelector")
	case req.Method == http.MethodGet && path == "/apis/storage.k8s.io/v1/volumeattachments":
		return verb + " volumeattachments"
	case req.Method == http.MethodGet && strings.HasPrefix(path, "/api/v1/nodes/"):
		return "get node " + strings.TrimPrefix(path, "/api/v1/nodes/")
	case req.Method == http.MethodGet && strings.HasPrefix(path, maintenanceLeases):
		return "get lease " + strings.TrimPrefix(path, maintenanceLeases)
	}
	return ""
}

const maintenanceLeases = "/apis/coordination.k8s.io/v1/namespaces/" + ngv1alpha1.MaintenanceLeaseNamespace + "/leases/"

func (l *apiLog) count(line string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.seen {
		if s == line {
			n++
		}
	}
	return n
}

// startController runs the termination controller in a manager until the
// test ends, with the fixture's events and eviction counts.
func (f *fixture) startController(t *testing.T, opts Options) *apiLog {
	t.Helper()
	log := &apiLog{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		log.next = rt
		return log
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	opts.Identity, opts.DaemonSets, opts.DrainBackstop = "test", drain.DaemonSetsLast, time.Hour
	r := &Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Evictor:  &drain.Evictor{Client: mgr.GetClient(), Parallel: 4, Observe: f.r.Evictor.Observe},
		Recorder: f.events, Clock: clock.RealClock{}, Opts: opts,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return log
}

func (f *fixture) evictionsWith(result string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.evictions[result]
}

// wakeups is the sample count of nodeguard_drain_wakeup_delay_seconds.
func wakeups(t *testing.T) uint64 {
	t.Helper()
	return sampleCount(t, "nodeguard_drain_wakeup_delay_seconds")
}

// terminationPasses counts the termination controller's reconciles so far.
func terminationPasses(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range families {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "termination" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// sampleCount is the sample count of a histogram on the metrics registry.
func sampleCount(t *testing.T, name string) uint64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}

// TestPDBThatAllowsAgainWakesItsQueue: three Ready pods under a PDB allowing
// one disruption. The drain evicts the first, which spends the budget, and the
// queue parks. Each status write of the PDB that allows a disruption again
// (the test plays the disruption controller) sends the next eviction at once,
// counted as a wake-up, and pods going (the kubelet's part, played by the
// test) move the drain on until the node is released: with no poll in between.
func TestPDBThatAllowsAgainWakesItsQueue(t *testing.T) {
	f := newFixture(t, "wake")
	node := f.ns + "-node"
	f.node(t, node)
	web := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		readyPod(t, f.pod(t, name, node, web))
	}
	f.pdb(t, "web", builder.MaxUnavailable("1"), 1, 3, 2, 3)
	passesBefore := terminationPasses(t)
	log := f.startController(t, Options{})
	f.deleteNode(t, node)

	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return f.evictionsWith(drain.ResultEvicted) == 1, nil
	}, "the first eviction succeeds")
	if got := []string{f.podState(t, "web-0"), f.podState(t, "web-1"), f.podState(t, "web-2")}; got[0] != "terminating" || got[1] != "running" || got[2] != "running" {
		t.Fatalf("pods web-0..2 are %v, want terminating, running, running", got)
	}

	for i, next := range []string{"web-1", "web-2"} {
		before := wakeups(t)
		f.pdbStatus(t, "web", 1, 3, 2, 3) // the replacement is Ready: one more disruption allowed
		harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
			return f.podState(t, next) == "terminating", nil
		}, "the status change wakes the queue: %s is evicted", next)
		if got := wakeups(t) - before; got != 1 {
			t.Errorf("wake-up %d: nodeguard_drain_wakeup_delay_seconds counted %d wake-ups, want 1", i+1, got)
		}
		if i == 0 && f.podState(t, "web-2") != "running" {
			t.Fatal("web-2 was evicted in the same round: the PDB allowed one disruption")
		}
	}
	if got := f.evictionsWith(drain.ResultEvicted); got != 3 {
		t.Errorf("%d evictions answered 200, want 3 (one per pod)", got)
	}

	for _, name := range []string{"web-0", "web-1", "web-2"} {
		f.finish(t, name)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, node)
	}, "the pods' going wakes the drain and the node is released")

	// Passes plan from the node's pod watch, not a list each; a fresh list
	// only starts the drain and proves the node empty. The maintenance Lease
	// is read fresh only to take it and to give it back: the cache shows it held
	// in between. Once the node drains, its passes read it from the cache.
	passes := int(terminationPasses(t) - passesBefore)
	lists, leaseReads, nodeReads := log.count("list pods spec.nodeName="+node), log.count("get lease "+node), log.count("get node "+node)
	t.Logf("%d passes, %d lists of the node's pods, %d fresh reads of its Lease, %d of the node", passes, lists, leaseReads, nodeReads)
	if lists > 4 || lists >= passes {
		t.Errorf("%d lists of the node's pods in %d passes, want at most 4 (the first pass, the watch's own, the checks that it is empty)", lists, passes)
	}
	if nodeReads >= passes {
		t.Errorf("%d fresh reads of the node in %d passes, want the draining node's passes to read the cache", nodeReads, passes)
	}
	// The check that the node is empty reads kube-apiserver's watch cache
	// no older than the node's pod watch, never etcd's every pod.
	if log.count("list pods spec.nodeName="+node+" notOlderThan") == 0 {
		t.Errorf("no list of the node's pods was served not older than its watch's version, want the check that it is empty")
	}
	if leaseReads > 2 {
		t.Errorf("%d fresh reads of the maintenance Lease in %d passes, want at most 2 (taking it, giving it back)", leaseReads, passes)
	}
}

// TestVolumeAttachmentGoingReleasesTheNode: a drained node waits for its
// VolumeAttachment and goes when it does, woken by the watch of
// VolumeAttachments: one list of them (the cache's), never one per pass.
func TestVolumeAttachmentGoingReleasesTheNode(t *testing.T) {
	f := newFixture(t, "volwake")
	node := f.ns + "-node"
	f.node(t, node)
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-disk"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "disk.csi.azure.com", NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-" + f.ns)}},
	}
	harness.MustCreate(t, env.Client, va)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), va) })
	// Another node's attachment, whose changes must not matter.
	other := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-other"}, Spec: *va.Spec.DeepCopy()}
	other.Spec.NodeName = f.ns + "-elsewhere"
	harness.MustCreate(t, env.Client, other)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), other) })

	log := f.startController(t, Options{VolumeDetachTimeout: time.Hour})
	f.deleteNode(t, node)
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return len(f.events.with(ReasonWaitingForVolumeDetach)) == 1, nil
	}, "the drained node waits for its VolumeAttachment")
	// More passes while it waits (each node change is one): none lists the
	// VolumeAttachments, and another node's attachment going does not matter.
	passes := log.count("get node " + node)
	for i := range 3 {
		patch := client.MergeFrom(getNode(t, node))
		n := getNode(t, node)
		n.Labels = map[string]string{"poke": fmt.Sprint(i)}
		if err := env.Client.Patch(context.Background(), n, patch); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		return log.count("get node "+node) >= passes+1, nil
	}, "node changes run passes")
	if err := env.Client.Delete(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if gone, err := harness.NodeGone(context.Background(), env.Client, node); gone || err != nil {
		t.Fatalf("node gone %v (%v) while its VolumeAttachment is there", gone, err)
	}
	lists := log.count("list volumeattachments")

	if err := env.Client.Delete(context.Background(), va); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, node)
	}, "the VolumeAttachment's going releases the node")
	if n := log.count("list volumeattachments"); n > 1 || n != lists {
		t.Errorf("%d lists of VolumeAttachments (%d while the node waited), want at most the cache's one: the cache watches them", n, lists)
	}
	if log.count("watch volumeattachments") == 0 {
		t.Error("VolumeAttachments were never watched")
	}
}
