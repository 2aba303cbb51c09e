package finalizer

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// countingInstances answers from exists and counts the questions.
type countingInstances struct {
	exists bool
	err    error
	asked  int
}

func (c *countingInstances) InstanceExists(context.Context, *corev1.Node) (bool, error) {
	c.asked++
	return c.exists, c.err
}

// TestCachedInstances: an "exists" answer is reused within the TTL and asked
// again after it; "gone" and errors are never reused.
func TestCachedInstances(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", UID: "u1"}, Spec: corev1.NodeSpec{ProviderID: "azure:///x"}}
	for _, tc := range []struct {
		name      string
		exists    bool
		err       error
		step      time.Duration
		wantAsked int
	}{
		{name: "exists, within the TTL", exists: true, step: 4 * time.Second, wantAsked: 1},
		{name: "exists, past the TTL", exists: true, step: 5 * time.Second, wantAsked: 2},
		{name: "gone is not cached", exists: false, step: time.Second, wantAsked: 2},
		{name: "an error is not cached", exists: true, err: errors.New("throttled"), step: time.Second, wantAsked: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
			inner := &countingInstances{exists: tc.exists, err: tc.err}
			c := &CachedInstances{Checker: inner, TTL: DefaultInstanceCacheTTL, Clock: clock}
			for range 2 {
				got, err := c.InstanceExists(context.Background(), node)
				if !errors.Is(err, tc.err) || (err == nil && got != tc.exists) {
					t.Fatalf("InstanceExists = %v, %v; want %v, %v", got, err, tc.exists, tc.err)
				}
				clock.SetTime(clock.Now().Add(tc.step))
			}
			if inner.asked != tc.wantAsked {
				t.Errorf("ARM asked %d times, want %d", inner.asked, tc.wantAsked)
			}
		})
	}
	// Another node (or a replacement with a new UID) is asked about on its own.
	clock := clocktesting.NewFakePassiveClock(time.Unix(1_800_000_000, 0))
	inner := &countingInstances{exists: true}
	c := &CachedInstances{Checker: inner, TTL: DefaultInstanceCacheTTL, Clock: clock}
	other := node.DeepCopy()
	other.UID = "u2"
	_, _ = c.InstanceExists(context.Background(), node)
	_, _ = c.InstanceExists(context.Background(), other)
	if inner.asked != 2 {
		t.Errorf("ARM asked %d times for two nodes, want 2", inner.asked)
	}
}
