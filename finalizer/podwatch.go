package finalizer

import (
	"context"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// nodePods watches the pods of each node being drained, one watch per node
// selected by spec.nodeName (as a kubelet watches its own): a change that
// matters to the drain wakes the node's reconcile at once, with no polling.
// There is no cluster-wide pod cache; a watch ends with its node's drain.
type nodePods struct {
	// listWatch makes the list-watch of one node's pods.
	listWatch func(node string) toolscache.ListerWatcher
	// wake takes the nodes to reconcile (the controller's wake-up channel).
	wake chan<- event.GenericEvent
	// emptied, if set, is told at once when a node's last pod that a drain
	// waits for goes (a pod deleted or finished), before the coalesced pass.
	emptied func(ctx context.Context, node string)

	mu      sync.Mutex
	stopped bool
	watches map[string]*podWatch
	// pending are the nodes whose pass is already asked for, within
	// podEventsCoalesce.
	pending map[string]bool
}

// podWatch is the watch of one node's pods.
type podWatch struct {
	cancel   context.CancelFunc
	informer toolscache.SharedIndexInformer
	// draining: the node drains, and its pods' changes wake it. A node
	// waiting for a drain slot only keeps the cache warm (prepare).
	draining atomic.Bool
}

// podEventsCoalesce gathers the pod events of one node into one drain pass:
// a wave of evictions makes a wave of events, and each pass reads the node,
// its Lease and its pods. The evictions themselves never wait for a pass
// (parked queues are woken by their PDBs), so this only delays noticing that
// the last pod of a tier went.
const podEventsCoalesce = 100 * time.Millisecond

func newNodePods(cs kubernetes.Interface, wake chan<- event.GenericEvent) *nodePods {
	return &nodePods{
		listWatch: func(node string) toolscache.ListerWatcher {
			return toolscache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
			})
		},
		wake:    wake,
		watches: map[string]*podWatch{},
		pending: map[string]bool{},
	}
}

// watch starts watching the node's pods, once, and has their changes wake
// the node's drain.
func (w *nodePods) watch(node string) {
	if pw := w.prepare(node); pw != nil {
		pw.draining.Store(true)
	}
}

// prepare starts watching the node's pods, once, without waking the node:
// the pass its drain slot wakes then plans from a synced cache.
func (w *nodePods) prepare(node string) *podWatch {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if pw, ok := w.watches[node]; ok || w.stopped {
		return pw
	}
	ctx, cancel := context.WithCancel(context.Background())
	inf := toolscache.NewSharedIndexInformer(w.listWatch(node), &corev1.Pod{}, 0, toolscache.Indexers{})
	pw := &podWatch{cancel: cancel, informer: inf}
	w.watches[node] = pw
	_ = inf.SetTransform(cache.TransformStripManagedFields())
	changed := func() {
		if pw.draining.Load() {
			w.notify(ctx, node)
			w.checkEmpty(ctx, node, inf)
		}
	}
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
		// The initial list wakes a draining node too: a change between the
		// drain pass's own list and this one is not missed.
		AddFunc: func(any, bool) {
			if pw.draining.Load() {
				w.notify(ctx, node)
			}
		},
		UpdateFunc: func(old, cur any) {
			if matters(old, cur) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
	go inf.RunWithContext(ctx)
	return pw
}

// unwatch stops watching the node's pods.
func (w *nodePods) unwatch(node string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if pw, ok := w.watches[node]; ok {
		pw.cancel()
		delete(w.watches, node)
	}
}

// cached returns the node's pods as its watch last saw them, once the watch
// has synced: a drain pass plans from them instead of listing the node's pods
// again. The pods are shared with the watch: read only.
func (w *nodePods) cached(node string) ([]corev1.Pod, bool) {
	if w == nil {
		return nil, false
	}
	w.mu.Lock()
	pw, ok := w.watches[node]
	w.mu.Unlock()
	if !ok || !pw.informer.HasSynced() {
		return nil, false
	}
	objs := pw.informer.GetStore().List()
	pods := make([]corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, *p)
		}
	}
	return pods, true
}

// version is the resourceVersion the node's watch saw last ("" without a
// synced watch).
func (w *nodePods) version(node string) string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	pw, ok := w.watches[node]
	w.mu.Unlock()
	if !ok || !pw.informer.HasSynced() {
		return ""
	}
	return pw.informer.LastSyncResourceVersion()
}

// checkEmpty tells emptied when the watch holds no pod a drain waits for:
// only mirror pods and finished pods, which no drain evicts. A lagging
// watch only ever shows more pods than are left, never fewer.
func (w *nodePods) checkEmpty(ctx context.Context, node string, inf toolscache.SharedIndexInformer) {
	if w.emptied == nil {
		return
	}
	for _, o := range inf.GetStore().List() {
		if p, ok := o.(*corev1.Pod); !ok || !drain.NeverWaitedFor(p) {
			return
		}
	}
	w.emptied(ctx, node)
}

// Start implements manager.Runnable: it stops every watch on shutdown (the
// watches themselves start with the drains, on the leader).
func (w *nodePods) Start(ctx context.Context) error {
	<-ctx.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for node, pw := range w.watches {
		pw.cancel()
		delete(w.watches, node)
	}
	return nil
}

// notify asks for a pass of the node, once per podEventsCoalesce.
func (w *nodePods) notify(ctx context.Context, node string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending[node] {
		return
	}
	w.pending[node] = true
	time.AfterFunc(podEventsCoalesce, func() {
		w.mu.Lock()
		delete(w.pending, node)
		w.mu.Unlock()
		wakeNode(ctx, w.wake, node)
	})
}

// wakeNode asks for a pass of the node through one of the controller's
// wake-up channels. A Reconciler not set up with a manager (unit tests) has
// none: a send on a nil channel would block until ctx ends.
func wakeNode(ctx context.Context, wake chan<- event.GenericEvent, node string) {
	if wake == nil {
		return
	}
	select {
	case wake <- event.GenericEvent{Object: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}}:
	case <-ctx.Done():
	}
}

// matters reports whether a pod update can change a drain pass: the pod
// started terminating or finished, a pod not terminating changed readiness
// (the queues put pods not Ready first, and a PDB may let them go), or its
// labels or annotations changed (PDB selection, do-not-evict). Status
// chatter does not wake it.
func matters(oldObj, curObj any) bool {
	old, ok1 := oldObj.(*corev1.Pod)
	cur, ok2 := curObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	return (old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
		old.Status.Phase != cur.Status.Phase ||
		cur.DeletionTimestamp == nil && drain.PodReady(old) != drain.PodReady(cur) ||
		!maps.Equal(old.Labels, cur.Labels) || !maps.Equal(old.Annotations, cur.Annotations) ||
		!reflect.DeepEqual(old.OwnerReferences, cur.OwnerReferences)
}
