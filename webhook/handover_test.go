package webhook_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// handoverDuration is how long the two leaders overlap in
// TestTwoLeadersAtAHandOverNeverOverAdmit; NODEGUARD_HANDOVER_DURATION (a Go
// duration) runs it longer.
func handoverDuration(t *testing.T) time.Duration {
	v := os.Getenv("NODEGUARD_HANDOVER_DURATION")
	if v == "" {
		return 15 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("NODEGUARD_HANDOVER_DURATION=%q: %v", v, err)
	}
	return d
}

// oldLeaderLag is how far behind the old leader's node watch runs: a leader
// about to lose its Lease is typically one whose API connection is slow.
const oldLeaderLag = 1500 * time.Millisecond

// TestTwoLeadersAtAHandOverNeverOverAdmit runs two leaders at once, each with
// its own status controller, claimer and webhook server, as at a leader
// hand-over where the old leader does not yet know it lost: the old one's node
// watch lags behind. The API server spreads the DELETE admissions over both.
// Meanwhile nodes blink NotReady and back, deletes hit nodes that just came
// back, deleted nodes go and new ones come. At every admission, the nodes
// whose delete was admitted while Ready (charged) and that are not yet gone
// never exceed maxUnavailable.
func TestTwoLeadersAtAHandOverNeverOverAdmit(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const budgetSize = 3
	oldMgr, oldAddr, oldAnswers := newManagerFor(t, laggingNodeWatch(env.Config, oldLeaderLag))
	setupGuard(t, oldMgr, true, false, nil)
	oldLeader := run(t, oldMgr, oldAddr, oldAnswers)
	newLeader := startGuard(t, false)
	useGuards(t, oldLeader, newLeader)

	pool := uniqueName("handover")
	c := &handoverChaos{t: t, pool: pool, budget: budgetSize, recovered: make(chan string, 16)}
	for range 10 {
		c.addNode()
	}
	createBudget(t, pool, budgetSize, builder.NDBMaxUnavailable(fmt.Sprint(budgetSize)))

	ctx, cancel := context.WithTimeout(context.Background(), handoverDuration(t))
	defer cancel()
	var wg sync.WaitGroup
	for _, work := range []func(context.Context){c.blink, c.blink, c.deleteRecovered, c.deleteAny, c.deleteAny, c.reap} {
		wg.Add(1)
		go func() { defer wg.Done(); work(ctx) }()
	}
	wg.Wait()

	t.Logf("admitted %d deletes of Ready nodes (%d more of NotReady ones), %d denied, %d blinks, %d nodes reaped; most charged at once: %d of %d",
		c.admitted.Load(), c.admittedUnready.Load(), c.denied.Load(), c.blinks.Load(), c.reaped.Load(), c.maxCharged.Load(), budgetSize)
	if c.admitted.Load() < budgetSize {
		t.Errorf("only %d deletes admitted: the test exercised too little", c.admitted.Load())
	}
	for _, v := range c.violations() {
		t.Error(v)
	}
	c.requireSettled()
}

// handoverChaos drives the nodes of one pool. Every change to a node happens
// under that node's lock, so the test knows whether a node was Ready when its
// delete was admitted.
type handoverChaos struct {
	t      *testing.T
	pool   string
	budget int
	// recovered are nodes that just came back Ready.
	recovered chan string

	mu       sync.Mutex
	names    []string
	locks    map[string]*sync.Mutex
	deleting map[string]time.Time // admitted, not yet reaped
	charged  map[string]bool      // of deleting: admitted while Ready
	violated []string
	next     int

	admitted, admittedUnready, denied, blinks, reaped, maxCharged atomic.Int64
}

// addNode creates a Ready node of the pool (the webhook puts the finalizer on).
func (c *handoverChaos) addNode() {
	c.mu.Lock()
	name := fmt.Sprintf("%s-%d", c.pool, c.next)
	c.next++
	c.mu.Unlock()
	if err := env.Client.Create(context.Background(), builder.Node(name, builder.WithLabels("pool", c.pool), builder.Ready())); err != nil {
		c.t.Errorf("creating node %s: %v", name, err)
		return
	}
	releaseOnCleanup(c.t, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.locks == nil {
		c.locks, c.deleting, c.charged = map[string]*sync.Mutex{}, map[string]time.Time{}, map[string]bool{}
	}
	c.names = append(c.names, name)
	c.locks[name] = &sync.Mutex{}
}

// pick returns a random node (not deleting, if live) and its lock.
func (c *handoverChaos) pick(live bool) (string, *sync.Mutex) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var from []string
	for _, n := range c.names {
		if _, deleting := c.deleting[n]; !live || !deleting {
			from = append(from, n)
		}
	}
	if len(from) == 0 {
		return "", nil
	}
	n := from[rand.IntN(len(from))]
	return n, c.locks[n]
}

func (c *handoverChaos) lockOf(name string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.locks[name]
}

// pause waits d, or less when ctx ends; false when it ended.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// blink turns random nodes (deleting ones too) NotReady for a moment and
// Ready again, handing each back to deleteRecovered.
func (c *handoverChaos) blink(ctx context.Context) {
	for pause(ctx, time.Duration(50+rand.IntN(100))*time.Millisecond) {
		name, lock := c.pick(false)
		if name == "" {
			continue
		}
		lock.Lock()
		c.setReady(name, false)
		lock.Unlock()
		if !pause(ctx, time.Duration(100+rand.IntN(200))*time.Millisecond) {
			lock.Lock()
			c.setReady(name, true)
			lock.Unlock()
			return
		}
		lock.Lock()
		c.setReady(name, true)
		lock.Unlock()
		c.blinks.Add(1)
		select {
		case c.recovered <- name:
		default:
		}
	}
}

// setReady sets the node's Ready condition, as its kubelet would; a node
// already gone is left alone.
func (c *handoverChaos) setReady(name string, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":%q,"reason":"Test","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		status, metav1.Now().UTC().Format(time.RFC3339), metav1.Now().UTC().Format(time.RFC3339))
	node := &corev1.Node{}
	node.Name = name
	err := env.Client.Status().Patch(context.Background(), node, client.RawPatch("application/strategic-merge-patch+json", []byte(patch)))
	if client.IgnoreNotFound(err) != nil {
		c.t.Errorf("setting node %s Ready=%v: %v", name, ready, err)
	}
}

// deleteRecovered deletes nodes a moment after they came back Ready: within
// the old leader's lag, which still sees them NotReady.
func (c *handoverChaos) deleteRecovered(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-c.recovered:
			if pause(ctx, time.Duration(100+rand.IntN(400))*time.Millisecond) {
				c.tryDelete(name, c.lockOf(name))
			}
		}
	}
}

func (c *handoverChaos) deleteAny(ctx context.Context) {
	for pause(ctx, time.Duration(20+rand.IntN(50))*time.Millisecond) {
		if name, lock := c.pick(true); name != "" {
			c.tryDelete(name, lock)
		}
	}
}

// tryDelete deletes the node through the API server (and so the webhook) and
// checks the budget when the delete was admitted while the node was Ready.
func (c *handoverChaos) tryDelete(name string, lock *sync.Mutex) {
	lock.Lock()
	defer lock.Unlock()
	var node corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &node); err != nil || node.DeletionTimestamp != nil {
		return
	}
	unavailable, _ := budget.Unavailable(&node, nil)
	err := env.Client.Delete(context.Background(), &node)
	switch {
	case apierrors.IsTooManyRequests(err): // the budget is used up, or busy: retry later
		c.denied.Add(1)
		return
	case err != nil:
		c.t.Errorf("deleting node %s: %v", name, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleting[name] = time.Now()
	if unavailable { // the webhook charged nothing
		c.admittedUnready.Add(1)
		return
	}
	c.admitted.Add(1)
	c.charged[name] = true
	n := int64(len(c.charged))
	if n > c.maxCharged.Load() {
		c.maxCharged.Store(n)
	}
	if int(n) > c.budget {
		c.violated = append(c.violated, fmt.Sprintf("deleting %s admitted while %d nodes deleted while Ready are not yet gone (maxUnavailable %d): %v",
			name, n, c.budget, c.charged))
	}
}

// reap lets deleting nodes go after a moment, as a finished drain does, and
// adds a new node for each. A node leaves the count before it goes, so
// the count never runs ahead of the cluster.
func (c *handoverChaos) reap(ctx context.Context) {
	for pause(ctx, 100*time.Millisecond) {
		for _, name := range c.deletingSince(time.Duration(300+rand.IntN(1000)) * time.Millisecond) {
			lock := c.lockOf(name)
			lock.Lock()
			c.mu.Lock()
			delete(c.charged, name)
			c.mu.Unlock()
			c.removeFinalizer(name)
			c.mu.Lock()
			delete(c.deleting, name)
			c.names = remove(c.names, name)
			c.mu.Unlock()
			lock.Unlock()
			c.reaped.Add(1)
			c.addNode()
		}
	}
}

func (c *handoverChaos) deletingSince(d time.Duration) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name, at := range c.deleting {
		if time.Since(at) > d {
			out = append(out, name)
		}
	}
	return out
}

func (c *handoverChaos) removeFinalizer(name string) {
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	node := &corev1.Node{}
	node.Name = name
	if err := env.Client.Patch(context.Background(), node, client.RawPatch("application/merge-patch+json", patch)); client.IgnoreNotFound(err) != nil {
		c.t.Errorf("releasing node %s: %v", name, err)
	}
}

func remove(names []string, name string) []string {
	out := names[:0]
	for _, n := range names {
		if n != name {
			out = append(out, n)
		}
	}
	return out
}

func (c *handoverChaos) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violated
}

// requireSettled checks the budget once the overlap is over and every node is
// Ready: it charges exactly the nodes deleted while Ready and not yet gone,
// and allows what is left.
func (c *handoverChaos) requireSettled() {
	c.t.Helper()
	c.mu.Lock()
	names := append([]string(nil), c.names...)
	charged := len(c.charged)
	deleting := len(c.deleting)
	c.mu.Unlock()
	for _, n := range names {
		c.setReady(n, true)
	}
	want := int32(max(c.budget-deleting, 0))
	harness.Eventually(c.t, 30*time.Second, func(context.Context) (bool, error) {
		ndb := getBudget(c.t, c.pool)
		return len(ndb.Status.DisruptedNodes) == charged && ndb.Status.DisruptionsAllowed == want, nil
	}, "the budget charges the %d nodes deleted while Ready and allows %d (%d deleting)", charged, want, deleting)
}

// laggingNodeWatch returns cfg with every node watch stream delivered lag
// late, in order.
func laggingNodeWatch(cfg *rest.Config, lag time.Duration) *rest.Config {
	return wrapWatches(cfg, "/api/v1/nodes", func(body io.ReadCloser) io.ReadCloser { return newLaggingBody(body, lag, nil) })
}

// wrapWatches returns cfg with the body of every watch stream of path
// wrapped.
func wrapWatches(cfg *rest.Config, path string, wrap func(io.ReadCloser) io.ReadCloser) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err != nil || req.URL.Path != path || req.URL.Query().Get("watch") != "true" {
				return resp, err
			}
			resp.Body = wrap(resp.Body)
			return resp, nil
		})
	})
	return cfg
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// laggingBody hands out what its body read, each chunk lag after it arrived;
// a chunk read while drop (when set) says so is never handed out.
type laggingBody struct {
	body    io.ReadCloser
	lag     time.Duration
	drop    func() bool
	chunks  chan lagChunk
	pending []byte
}

type lagChunk struct {
	data []byte
	at   time.Time
	err  error
}

func newLaggingBody(body io.ReadCloser, lag time.Duration, drop func() bool) *laggingBody {
	b := &laggingBody{body: body, lag: lag, drop: drop, chunks: make(chan lagChunk, 4096)}
	go b.pump()
	return b
}

func (b *laggingBody) pump() {
	for {
		buf := make([]byte, 32<<10)
		n, err := b.body.Read(buf)
		if n > 0 && (b.drop == nil || !b.drop()) {
			b.chunks <- lagChunk{data: buf[:n], at: time.Now()}
		}
		if err != nil {
			b.chunks <- lagChunk{err: err, at: time.Now()}
			return
		}
	}
}

func (b *laggingBody) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		ch := <-b.chunks
		if wait := time.Until(ch.at.Add(b.lag)); wait > 0 {
			time.Sleep(wait) // the lag itself, not a wait for a condition
		}
		if ch.err != nil {
			b.chunks <- ch // every later Read ends the same way
			return 0, ch.err
		}
		b.pending = ch.data
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *laggingBody) Close() error { return b.body.Close() }
