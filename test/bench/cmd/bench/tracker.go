package main

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeguard/nodeguard/test/bench"
)

// podTracker watches the benchmark's pods (one informer, a label selector)
// and keeps, from begin on, step functions of the pods left on each node and
// of the healthy (Ready, not deleting) pods of each workload ("ns/app"), and
// the most unavailable pods each workload had.
type podTracker struct {
	mu        sync.Mutex
	start     time.Time
	began     bool
	pods      map[string]trackedPod // ns/name
	remaining map[string][]bench.Point
	healthy   map[string][]bench.Point
	replicas  map[string]int
	maxUnav   map[string]int
}

type trackedPod struct {
	node, workload string
	healthy        bool
}

func startPodTracker(ctx context.Context, cfg *rest.Config, selector string, replicas map[string]int) (*podTracker, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	t := &podTracker{pods: map[string]trackedPod{}, remaining: map[string][]bench.Point{}, healthy: map[string][]bench.Point{},
		replicas: replicas, maxUnav: map[string]int{}}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := f.Core().V1().Pods().Informer()
	if err := watchSynced(ctx, f, inf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.observe(obj, false) },
		UpdateFunc: func(_, obj any) { t.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			t.observe(obj, true)
		},
	}); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *podTracker) observe(obj any, deleted bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	key := p.Namespace + "/" + p.Name
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.pods[key]
	if deleted {
		delete(t.pods, key)
	} else {
		t.pods[key] = trackedPod{node: p.Spec.NodeName, workload: p.Namespace + "/" + p.Labels["app"],
			healthy: p.DeletionTimestamp == nil && podReady(p)}
	}
	if !t.began {
		return
	}
	now := time.Since(t.start)
	for _, n := range []string{old.node, p.Spec.NodeName} {
		if n != "" {
			appendPoint(t.remaining, n, now, t.countOn(n))
		}
	}
	w := p.Namespace + "/" + p.Labels["app"]
	h := t.countHealthy(w)
	appendPoint(t.healthy, w, now, h)
	if r, ok := t.replicas[w]; ok {
		t.maxUnav[w] = max(t.maxUnav[w], r-h)
	}
}

func appendPoint(m map[string][]bench.Point, key string, at time.Duration, v int) {
	pts := m[key]
	if len(pts) > 0 && pts[len(pts)-1].V == v {
		return
	}
	m[key] = append(pts, bench.Point{T: at, V: v})
}

func (t *podTracker) countOn(node string) int {
	n := 0
	for _, p := range t.pods {
		if p.node == node {
			n++
		}
	}
	return n
}

func (t *podTracker) countHealthy(workload string) int {
	n := 0
	for _, p := range t.pods {
		if p.workload == workload && p.healthy {
			n++
		}
	}
	return n
}

// begin starts the clock, or starts it again (a new window: what an earlier
// one recorded is dropped), and records the initial values of the given
// nodes and of every workload with a replica count.
func (t *podTracker) begin(nodes ...string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start, t.began = time.Now(), true
	t.remaining, t.healthy = map[string][]bench.Point{}, map[string][]bench.Point{}
	for _, n := range nodes {
		appendPoint(t.remaining, n, 0, t.countOn(n))
	}
	for w, r := range t.replicas {
		h := t.countHealthy(w)
		appendPoint(t.healthy, w, 0, h)
		t.maxUnav[w] = r - h
	}
	return t.start
}

// left is how many pods are on the node now.
func (t *podTracker) left(node string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.countOn(node)
}

func (t *podTracker) timeline(node string) []bench.Point {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]bench.Point(nil), t.remaining[node]...)
}

func (t *podTracker) healthyTimeline(workload string) []bench.Point {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]bench.Point(nil), t.healthy[workload]...)
}

func (t *podTracker) maxUnavailable(workload string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxUnav[workload]
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// watchSynced adds h to the factory's informer inf, starts the factory and
// returns once h has seen every object of the initial list.
func watchSynced(ctx context.Context, f informers.SharedInformerFactory, inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return ctx.Err()
	}
	return nil
}
