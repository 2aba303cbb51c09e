package budget

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	goruntime "runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// counted is a budget whose status says it selects expected nodes, available
// of them available and not charged.
func counted(expected, available int32, mods ...func(*ngv1alpha1.NodeDisruptionBudget)) *ngv1alpha1.NodeDisruptionBudget {
	b := ndb(mods...)
	b.Status.ExpectedNodes, b.Status.CurrentAvailable = expected, available
	n, _ := FromStatus(b, now)
	b.Status.DesiredAvailable, b.Status.DisruptionsAllowed = n.Desired, n.Allowed
	return b
}

func claimOf(nodes ...string) []change {
	var cs []change
	for _, n := range nodes {
		cs = append(cs, change{node: n})
	}
	return cs
}

// TestApplyBatch: a batch applied to one read of a budget gives each change
// the verdict it would get alone, in arrival order.
func TestApplyBatch(t *testing.T) {
	tests := []struct {
		name        string
		budget      *ngv1alpha1.NodeDisruptionBudget
		changes     []change
		wantCharged []bool
		wantDenied  []int32 // the denial code per change, 0 for none
		wantNodes   []string
		wantAllowed int32
		wantChanged bool
	}{
		{name: "claims that fit are charged, the rest denied each with 429",
			budget: counted(10, 10, maxUnavailable("3")), changes: claimOf("a", "b", "c", "d", "e"),
			wantCharged: []bool{true, true, true, false, false}, wantDenied: []int32{0, 0, 0, 429, 429},
			wantNodes: []string{"a", "b", "c"}, wantAllowed: 0, wantChanged: true},
		{name: "an already charged node is not charged again, in the read or in the batch",
			budget: counted(10, 9, maxUnavailable("3"), charged("a")), changes: claimOf("a", "b", "b"),
			wantCharged: []bool{false, true, false}, wantDenied: []int32{0, 0, 0},
			wantNodes: []string{"a", "b"}, wantAllowed: 1, wantChanged: true},
		{name: "a release frees a disruption for a later claim",
			budget:      counted(10, 9, maxUnavailable("1"), charged("a")),
			changes:     []change{{node: "b"}, {node: "a", release: true}, {node: "c"}},
			wantCharged: []bool{false, false, true}, wantDenied: []int32{429, 0, 0},
			wantNodes: []string{"c"}, wantAllowed: 0, wantChanged: true},
		{name: "releasing a node not charged changes nothing",
			budget: counted(10, 10, maxUnavailable("1")), changes: []change{{node: "a", release: true}},
			wantCharged: []bool{false}, wantDenied: []int32{0}, wantAllowed: 1},
		{name: "a budget allowing none denies every claim with 403",
			budget: counted(3, 3, maxUnavailable("0")), changes: claimOf("a", "b"),
			wantCharged: []bool{false, false}, wantDenied: []int32{403, 403}, wantAllowed: 0},
		{name: "a status that counts none of the budget's nodes is stale: 429, not 403",
			budget: counted(0, 0, maxUnavailable("3")), changes: claimOf("a"),
			wantCharged: []bool{false}, wantDenied: []int32{429}, wantAllowed: 0},
		{name: "an open window denies with 429",
			budget: counted(6, 6, maxUnavailable("3"), window("0 9 * * 1-5", 8*time.Hour, ptr.To(intstr.FromInt32(1)))), changes: claimOf("a", "b"),
			wantCharged: []bool{true, false}, wantDenied: []int32{0, 429},
			wantNodes: []string{"a"}, wantAllowed: 0, wantChanged: true},
		{name: "a budget not evaluated since its change denies with 429",
			budget: counted(3, 3, maxUnavailable("1"), func(b *ngv1alpha1.NodeDisruptionBudget) { b.Generation = 2 }), changes: claimOf("a"),
			wantCharged: []bool{false}, wantDenied: []int32{429}, wantAllowed: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.budget.DeepCopy()
			got, vs, changed := (&Claimer{}).apply(tt.budget, tt.changes, now)
			for i, v := range vs {
				var d *Denial
				code := int32(0)
				if errors.As(v.err, &d) {
					code = d.Code
				} else if v.err != nil {
					t.Errorf("change %d: unexpected error %v", i, v.err)
				}
				if v.charged != tt.wantCharged[i] || code != tt.wantDenied[i] {
					t.Errorf("change %d (%+v): charged %v, denial %d; want %v, %d", i, tt.changes[i], v.charged, code, tt.wantCharged[i], tt.wantDenied[i])
				}
			}
			if nodes := slices.Sorted(maps.Keys(got.Status.DisruptedNodes)); !slices.Equal(nodes, tt.wantNodes) {
				t.Errorf("disruptedNodes = %v, want %v", nodes, tt.wantNodes)
			}
			if got.Status.DisruptionsAllowed != tt.wantAllowed || changed != tt.wantChanged {
				t.Errorf("allowed %d, changed %v; want %d, %v", got.Status.DisruptionsAllowed, changed, tt.wantAllowed, tt.wantChanged)
			}
			if !equalStatus(tt.budget, before) {
				t.Error("apply changed the budget it read")
			}
		})
	}
}

func equalStatus(a, b *ngv1alpha1.NodeDisruptionBudget) bool {
	return a.Status.CurrentAvailable == b.Status.CurrentAvailable && a.Status.DisruptionsAllowed == b.Status.DisruptionsAllowed &&
		maps.Equal(a.Status.DisruptedNodes, b.Status.DisruptedNodes)
}

// TestFailedWriteKeepsDenials: when the write fails, the claims it carried get
// its error; denials stand, as they came from the read.
func TestFailedWriteKeepsDenials(t *testing.T) {
	denial := &Denial{Code: http.StatusTooManyRequests}
	writeErr := errors.New("write failed")
	got := failed([]verdict{{charged: true}, {err: denial}, {}}, writeErr)
	if got[0].charged || !errors.Is(got[0].err, writeErr) || got[1].err != denial || !errors.Is(got[2].err, writeErr) {
		t.Errorf("verdicts after a failed write = %+v", got)
	}
}

// TestConcurrentClaimsShareOneWritePerRound holds the first claim's status
// write in flight until seven more claims wait on the same budget: the next
// round carries all seven in one write, and each gets its own verdict (the
// budget allows 6 in all: 5 of the 7 are charged, 2 denied).
func TestConcurrentClaimsShareOneWritePerRound(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(ngv1alpha1.AddToScheme(scheme))
	b := counted(20, 20, maxUnavailable("6"))
	b.ResourceVersion = ""
	gate := make(chan struct{})
	var writes atomic.Int32
	cl := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(b).WithObjects(b).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if writes.Add(1) == 1 {
				<-gate
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}}).Build()
	c := &Claimer{Client: cl, Reader: cl, Clock: clocktesting.NewFakePassiveClock(now)}

	type result struct {
		node    string
		charged bool
		err     error
	}
	results := make(chan result, 8)
	claim := func(name string) {
		ok, err := c.Claim(context.Background(), b.Name, node(name), false)
		results <- result{name, ok, err}
	}
	go claim("first")
	waitFor(t, func() bool { return writes.Load() == 1 }) // its write is in flight
	for i := range 7 {
		go claim(fmt.Sprintf("n%d", i))
	}
	waitFor(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.queues[b.Name].pending) == 7
	})
	close(gate)

	charged, denied := 0, 0
	for range 8 {
		r := <-results
		var d *Denial
		switch {
		case r.charged && r.err == nil:
			charged++
		case errors.As(r.err, &d) && d.Code == http.StatusTooManyRequests:
			denied++
		default:
			t.Errorf("%s: charged %v, error %v", r.node, r.charged, r.err)
		}
	}
	if charged != 6 || denied != 2 || writes.Load() != 2 {
		t.Errorf("%d charged, %d denied in %d status writes; want 6, 2 in 2", charged, denied, writes.Load())
	}
	var got ngv1alpha1.NodeDisruptionBudget
	if err := cl.Get(context.Background(), client.ObjectKey{Name: b.Name}, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Status.DisruptedNodes) != 6 || got.Status.DisruptionsAllowed != 0 {
		t.Errorf("status after the rounds: %+v", got.Status)
	}
}

// waitFor polls cond (the committer runs on its own goroutine).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		goruntime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// TestRetriedClaimStillTimesOut: a claim whose own request lost it (a give
// back that missed, or failed) and that every retry finds charged, each retry
// refused by another budget, must not live as long as the retries do. A
// re-claim moves the stamp (so that the first request's give-back misses it)
// but not the claim's age, and the status controller then drops it once no
// disruption shows.
func TestRetriedClaimStillTimesOut(t *testing.T) {
	c := &Claimer{}
	b, vs, _ := c.apply(counted(4, 4, maxUnavailable("2")), claimOf("x"), now)
	if !vs[0].charged {
		t.Fatalf("first claim: %+v, want charged", vs[0])
	}
	first := b.Status.DisruptedNodes["x"]
	at := now
	for range 12 { // kubectl drain retries every 5 s for a minute
		at = at.Add(5 * time.Second)
		b, vs, _ = c.apply(b, claimOf("x"), at)
		if vs[0].charged || vs[0].err != nil {
			t.Fatalf("re-claim at %v: %+v, want already charged", at, vs[0])
		}
	}
	if stamp := b.Status.DisruptedNodes["x"]; stamp.Equal(&first) {
		t.Fatalf("re-claims kept the first stamp %v: the first request's give-back would take the charge they rely on", stamp)
	}
	// Many re-claims within one second (a drain's evictions at once, on
	// several replicas) never move the stamp more than a second ahead of the
	// clock.
	for range 20 {
		b, _, _ = c.apply(b, claimOf("x"), at)
	}
	if stamp := b.Status.DisruptedNodes["x"]; stamp.After(at.Add(time.Second)) {
		t.Fatalf("20 re-claims at %v stamped x %v: ahead of the clock", at, stamp)
	}
	r := &StatusReconciler{ClaimTimeout: 2 * time.Minute, UnconfirmedTimeout: 15 * time.Second}
	selected := []*corev1.Node{node("x"), node("y"), node("z"), node("w")}
	claims := r.newClaimReview(b, selected)
	claims.fresh = map[string]*corev1.Node{"x": node("x")} // schedulable, not deleting: no disruption
	status, _ := r.computeStatus(b, selected, claims, at)
	if _, kept := status.DisruptedNodes["x"]; kept {
		t.Errorf("a minute of refused retries kept x charged (stamp %v at %v): the budget counts a disruption that never happened", b.Status.DisruptedNodes["x"], at)
	}
}
