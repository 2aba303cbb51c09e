package harness

import (
	"context"
	"net"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
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

// CountEvents counts the events with the reason about the named object.
func CountEvents(ctx context.Context, c client.Reader, regarding, reason string) (int, error) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list); err != nil {
		return 0, err
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name == regarding && e.Reason == reason {
			n++
		}
	}
	return n, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
