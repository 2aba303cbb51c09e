package azure

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
)

// withEmulator changes the emulator's options.
func withEmulator(f func(*armemulator.Options)) envOption {
	return func(s *envSettings) { f(s.emu) }
}

// restoresIn counts the reverts of restored entries set None again in a pool.
func restoresIn(pool string) float64 {
	return testutil.ToFloat64(reverts.WithLabelValues(pool, string(AdminStateNone)))
}

// countReasons counts a node's events of one reason.
func (e *testEnv) countReasons(node, reason string) int {
	n := 0
	for _, ev := range e.rec.all() {
		if ev.node == node && ev.reason == reason {
			n++
		}
	}
	return n
}

// restoreWithStaleCopy takes n0 Down, has cloud-provider-azure read the load
// balancers (its reconcile's copy, or its cache), restores None and forgets
// the node as the taint watcher does once None is confirmed. It returns the
// copy, which still shows n0 Down.
func restoreWithStaleCopy(t *testing.T, e *testEnv, unpolled bool) *armemulator.Snapshot {
	t.Helper()
	return restoreWithStaleCopies(t, e, unpolled, 1)[0]
}

// restoreWithStaleCopies is restoreWithStaleCopy with n copies read while n0
// is Down (each can write once).
func restoreWithStaleCopies(t *testing.T, e *testEnv, unpolled bool, n int) []*armemulator.Snapshot {
	t.Helper()
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	cp := armemulator.NewCloudProvider(e.emu)
	cp.Unpolled = unpolled
	var copies []*armemulator.Snapshot
	for range n {
		stale, err := cp.Read(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		copies = append(copies, stale)
	}
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	e.wantConfirmed(n0, AdminStateNone)
	e.m.Forget(n0.UID)
	return copies
}

// stalePut has cloud-provider-azure write the public pool from its stale
// copy, adding a node that joined: n0's entry is Down again.
func stalePut(t *testing.T, e *testEnv, stale *armemulator.Snapshot) {
	t.Helper()
	joiner := armemulator.Node{Name: "joiner", IPs: []string{"10.224.9.9"}}
	if _, err := stale.EnsureHostsInPool(e.ctx, "kubernetes", "kubernetes", emuNodes(e, joiner)); err != nil {
		t.Fatal(err)
	}
	if got := e.state("kubernetes", "kubernetes", e.nodes[0].Name); got != "Down" {
		t.Fatalf("the stale pool PUT left %s, want the restore undone (Down)", got)
	}
}

// unpolledLifetime is how long (real time) the stale PUT's operation keeps
// the load balancer busy when cloud-provider-azure leaves it unpolled.
const unpolledLifetime = 300 * time.Millisecond

// TestRestoredNoneHoldsAgainstStaleWrite: nodeguard restores None on a node
// (a drain called off, a signal gone) and forgets it; cloud-provider-azure
// then PUTs the pool from a copy it read while the node was Down (its LB
// cache keeps one for up to 120 s), 20 s or 90 s after the restore, its
// asynchronous operation polled to its end or left to run. The restored
// entry is still recorded, so the verification finds it Down and sets None
// again within 15 s of the end of that operation, with one Warning
// LoadBalancerAdminStateReverted and the revert metrics labelled None.
func TestRestoredNoneHoldsAgainstStaleWrite(t *testing.T) {
	for _, after := range []time.Duration{20 * time.Second, 90 * time.Second} {
		for _, unpolled := range []bool{false, true} {
			t.Run(fmt.Sprintf("after=%s/unpolled=%v", after, unpolled), func(t *testing.T) {
				store := NewMemoryRecords()
				e := newEnv(t, 3, false, withAsync(), withManager(WithRecords(store)),
					withEmulator(func(o *armemulator.Options) { o.UnpolledOperationLifetime = unpolledLifetime }))
				n0 := e.nodes[0]
				stale := restoreWithStaleCopy(t, e, unpolled)
				if got := recordedFor(store, n0.Name); len(got) != 0 {
					t.Errorf("n0 recorded Down in %v after its restore, want nowhere", got)
				}
				if got := store.Restored(); len(got) != 2 {
					t.Fatalf("restored entries recorded = %v, want n0's in both pools", got)
				}
				const pool = "kubernetes/kubernetes"
				before := restoresIn(pool)
				opens, _ := revertOpenCountOf(t, pool, AdminStateNone)

				e.step(after)
				e.tick()
				stalePut(t, e, stale)
				ended := 0 * time.Second // fake time since the stale operation ended
				if unpolled {
					// The operation runs on: the verification finds the
					// revert, and the rewrite meets the busy load balancer.
					e.step(e.m.cfg.VerifyInterval)
					e.tick()
					if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
						t.Fatalf("public pool = %s while the stale operation runs", got)
					}
					busy := 0
					for _, r := range e.emu.Requests() {
						if r.Method == http.MethodPut && strings.HasSuffix(r.Path, publicPool) && r.Status == http.StatusTooManyRequests {
							busy++
						}
					}
					if busy == 0 {
						t.Fatalf("no rewrite met the stale operation (429), want the busy path played")
					}
					time.Sleep(unpolledLifetime) // the emulator ends the operation in real time
				}
				for e.state("kubernetes", "kubernetes", n0.Name) != "None" {
					if ended >= 15*time.Second {
						t.Fatalf("n0 still Down %s after the stale operation ended, want None within 15s", ended)
					}
					e.step(time.Second)
					ended += time.Second
					e.tick()
				}
				e.wantStates(n0.Name, AdminStateNone)
				if got := e.countReasons(n0.Name, ReasonReverted); got != 1 {
					t.Errorf("%d %s events for n0, want 1", got, ReasonReverted)
				}
				for _, ev := range e.rec.all() {
					if ev.reason == ReasonReverted && (ev.typ != corev1.EventTypeWarning || !strings.Contains(ev.note, pool) || !strings.Contains(ev.note, "restored to None")) {
						t.Errorf("%s event %q (%s): want a Warning naming the pool and the restore", ReasonReverted, ev.note, ev.typ)
					}
				}
				if got := restoresIn(pool) - before; got != 1 {
					t.Errorf("reverts_total{pool=%s,state=None} grew by %v, want 1", pool, got)
				}
				if got, _ := revertOpenCountOf(t, pool, AdminStateNone); got != opens+1 {
					t.Errorf("revert_open_seconds{pool=%s,state=None} has %d observations, want %d", pool, got, opens+1)
				}
				if got := e.state("kubernetes", "kubernetes", "joiner"); got != "None" {
					t.Errorf("the entry cloud-provider-azure added is %q, want it left None", got)
				}
			})
		}
	}
}

// TestRestoreHoldEnds: a stale PUT late in --azure-admin-state-restore-hold
// (2m50s after the restore) is still undone; once the hold has passed, the
// restored entry leaves the record, the verification stops reading, and a
// stale PUT after that is no longer undone.
func TestRestoreHoldEnds(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 3, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	copies := restoreWithStaleCopies(t, e, false, 2)
	hold := e.m.cfg.RestoreHold
	if hold != 3*time.Minute {
		t.Fatalf("restore hold = %s, want the default 3m", hold)
	}
	e.step(hold - 10*time.Second)
	e.tick()
	stalePut(t, e, copies[0])
	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := e.countReasons(n0.Name, ReasonReverted); got != 1 {
		t.Errorf("%d %s events within the hold, want 1", got, ReasonReverted)
	}
	e.step(5 * time.Second) // the hold's end
	e.tick()
	if got := store.Restored(); len(got) != 0 {
		t.Errorf("restored entries recorded after the hold = %v, want none", got)
	}
	e.emu.ResetRequests()
	stalePut(t, e, copies[1])
	for range 3 {
		e.step(e.m.cfg.VerifyInterval)
		e.tick()
	}
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("n0 = %s: a stale PUT after the hold was undone", got)
	}
	if got := e.emu.Count(http.MethodGet, "/loadBalancers"); got != 0 {
		t.Errorf("%d load-balancer reads after the hold, want 0", got)
	}
	if got := e.countReasons(n0.Name, ReasonReverted); got != 1 {
		t.Errorf("%d %s events, want only the one within the hold", got, ReasonReverted)
	}
}

// TestRestoreHoldEndsWhenTheNodeIsDownAgainOrGone: a node that goes Down
// again during the hold is simply Down (recorded Down, no restored mark);
// a node deleted (or replaced by a node of its name) during the hold has its
// restored entries dropped, and a stale PUT then is left alone.
func TestRestoreHoldEndsWhenTheNodeIsDownAgainOrGone(t *testing.T) {
	t.Run("down again", func(t *testing.T) {
		store := NewMemoryRecords()
		e := newEnv(t, 3, false, withManager(WithRecords(store)))
		n0 := e.nodes[0]
		stale := restoreWithStaleCopy(t, e, false)
		e.step(20 * time.Second)
		e.tick()
		// The stale copy has n0 Down while nodeguard wants it Down again:
		// the entry is taken as nodeguard's Down, without a write.
		stalePut(t, e, stale)
		e.m.SetDesired(n0, AdminStateDown)
		e.tick()
		e.wantStates(n0.Name, AdminStateDown)
		e.wantConfirmed(n0, AdminStateDown)
		if got := recordedFor(store, n0.Name); len(got) != 2 {
			t.Errorf("n0 recorded Down in %v, want both pools", got)
		}
		if got := store.Restored(); len(got) != 0 {
			t.Errorf("restored entries = %v, want none: n0 is Down again", got)
		}
		e.step(e.m.cfg.VerifyInterval)
		e.tick()
		e.wantStates(n0.Name, AdminStateDown)
		if got := e.countReasons(n0.Name, ReasonReverted); got != 0 {
			t.Errorf("%d %s events, want 0", got, ReasonReverted)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		store := NewMemoryRecords()
		s := runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(s); err != nil {
			t.Fatal(err)
		}
		nodes := fake.NewClientBuilder().WithScheme(s).Build()
		e := newEnv(t, 3, false, withManager(WithRecords(store), WithNodeReader(nodes)))
		for _, n := range e.nodes {
			if err := nodes.Create(e.ctx, n.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
		n0 := e.nodes[0]
		stale := restoreWithStaleCopy(t, e, false)
		e.step(e.m.cfg.RetryInterval)
		e.tick()
		if got := store.Restored(); len(got) != 2 {
			t.Fatalf("restored entries of a node that exists = %v, want both pools", got)
		}
		if err := nodes.Delete(e.ctx, n0.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		e.step(e.m.cfg.RetryInterval)
		e.tick()
		if got := store.Restored(); len(got) != 0 {
			t.Errorf("restored entries of a deleted node = %v, want none", got)
		}
		stalePut(t, e, stale)
		e.step(e.m.cfg.VerifyInterval)
		e.tick()
		if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
			t.Errorf("the deleted node's entry = %s, want it left as the other writer put it", got)
		}
	})
	t.Run("cloud-provider signal", func(t *testing.T) {
		// With --signal-admin-state=cloud-provider, cloud-provider-azure sets
		// Down itself on a spot-eviction notice: that Down is not undone.
		store := NewMemoryRecords()
		e := newEnv(t, 3, false, withManager(WithRecords(store)))
		n0 := e.nodes[0]
		restoreWithStaleCopy(t, e, false)
		e.step(20 * time.Second)
		e.tick()
		tainted := n0.DeepCopy()
		tainted.Spec.Taints = []corev1.Taint{{Key: ngv1alpha1.SpotEvictionTaintKey, Value: ngv1alpha1.SpotEvictionTaintValue, Effect: corev1.TaintEffectNoSchedule}}
		e.m.Observe(tainted)
		e.setDownByOther("kubernetes", "kubernetes", n0.Name)
		e.step(e.m.cfg.VerifyInterval)
		e.tick()
		if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
			t.Errorf("cloud-provider-azure's Down for a spot eviction = %s, want it left Down", got)
		}
		if got := store.Restored(); len(got) != 0 {
			t.Errorf("restored entries of a node cloud-provider-azure takes Down = %v, want none", got)
		}
	})
	t.Run("replaced", func(t *testing.T) {
		store := NewMemoryRecords()
		e := newEnv(t, 3, false, withManager(WithRecords(store)))
		n0 := e.nodes[0]
		restoreWithStaleCopy(t, e, false)
		if got := store.Restored(); len(got) != 2 {
			t.Fatalf("restored entries = %v, want both pools", got)
		}
		e.m.Observe(replacement(n0))
		e.tick()
		if got := store.Restored(); len(got) != 0 {
			t.Errorf("restored entries of a replaced node = %v, want none", got)
		}
	})
}

// TestRestoreHoldSurvivesRestart: the restored entries and their windows are
// in the record, so a restarted nodeguard holds None for the rest of the
// window, and no longer.
func TestRestoreHoldSurvivesRestart(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 3, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	stale := restoreWithStaleCopy(t, e, false)
	e.step(time.Minute)
	e.m = e.remake()
	e.tick()
	stalePut(t, e, stale)
	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := e.countReasons(n0.Name, ReasonReverted); got != 1 {
		t.Errorf("%d %s events, want 1", got, ReasonReverted)
	}
	e.m = e.remake()
	e.step(2*time.Minute - e.m.cfg.VerifyInterval) // the window's end, from the restore
	e.tick()
	if got := store.Restored(); len(got) != 0 {
		t.Errorf("restored entries after the window = %v, want none", got)
	}
}
