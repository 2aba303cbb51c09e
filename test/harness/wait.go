package harness

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// EventTimeout bounds WaitForEvent.
const EventTimeout = 30 * time.Second

// WaitForEvent waits until an event with the reason is recorded about the
// named object (events.k8s.io/v1, any namespace).
func WaitForEvent(t testing.TB, c client.Reader, regarding, reason string) {
	t.Helper()
	Eventually(t, EventTimeout, func(ctx context.Context) (bool, error) {
		n, err := CountEvents(ctx, c, regarding, reason)
		return n > 0, err
	}, "an event %s about %s", reason, regarding)
}

// CountEvents counts the events with the reason about the named object: each
// event once, or as often as its series says it happened.
func CountEvents(ctx context.Context, c client.Reader, regarding, reason string) (int, error) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list); err != nil {
		return 0, err
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name == regarding && e.Reason == reason {
			n += EventOccurrences(e)
		}
	}
	return n, nil
}

// EventNotes returns the notes of the events with the reason about the named
// object.
func EventNotes(ctx context.Context, c client.Reader, regarding, reason string) ([]string, error) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == regarding && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out, nil
}

// EventOccurrences is how many times an event happened: 1, or its series' count.
func EventOccurrences(e eventsv1.Event) int {
	if e.Series != nil && e.Series.Count > 1 {
		return int(e.Series.Count)
	}
	return 1
}

// WaitForTerminationFinalizer waits until the node carries nodeguard's
// termination finalizer and the few-second hold after it was added has passed,
// so that a delete is guarded at once.
func WaitForTerminationFinalizer(t testing.TB, c client.Reader, node string) {
	t.Helper()
	Eventually(t, EventTimeout, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := c.Get(ctx, client.ObjectKey{Name: node}, &n)
		_, justAdded := n.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
		return err == nil && slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) && !justAdded, err
	}, "node %s carries the termination finalizer", node)
}

// PodReady reports whether the pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SkipWithoutEnv skips a test that needs the control plane when there is none
// (go test -short).
func SkipWithoutEnv(t testing.TB, env *Env) {
	t.Helper()
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
}

// MustCreate creates obj or fails the test.
func MustCreate(t testing.TB, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// NodeGone reports whether the node no longer exists.
func NodeGone(ctx context.Context, c client.Reader, name string) (bool, error) {
	err := c.Get(ctx, client.ObjectKey{Name: name}, &corev1.Node{})
	if client.IgnoreNotFound(err) != nil {
		return false, err
	}
	return err != nil, nil
}
