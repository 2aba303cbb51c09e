package main_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/internal/recorder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// eventsAbout lists the events.k8s.io events regarding a node.
func eventsAbout(t *testing.T, node *corev1.Node) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Regarding.UID == node.UID {
			out = append(out, ev)
		}
	}
	return out
}

func eventNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	if env == nil {
		t.Skip("needs a control plane")
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	return n
}

// Every event recorded before a stop is in the API once Flush returns, with no
// wait in between: the restart of a replica loses none. Past 10 events about
// one object that differ only in their note, the rest are combined into one
// series, as client-go's aggregator does; every occurrence is counted.
func TestEventsRecordedBeforeAStopAreWritten(t *testing.T) {
	node := eventNode(t, "events-flush")
	events := recorder.New(env.Client, env.Scheme, "test-host")
	rec := events.Recorder("nodeguard-test")
	const n = 40
	for i := range n {
		rec.Eventf(node, nil, corev1.EventTypeNormal, "Flushed", "Test", "event %d", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := events.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := eventsAbout(t, node)
	occurrences, combined := 0, 0
	for _, ev := range got {
		occurrences += harness.EventOccurrences(ev)
		if strings.HasPrefix(ev.Note, "(combined from similar events): ") {
			combined++
		}
	}
	if occurrences != n || len(got) != 11 || combined != 1 {
		t.Fatalf("%d events written counting %d occurrences, %d of them combined; want %d occurrences in 11 events: 10, then one combining the rest",
			len(got), occurrences, combined, n)
	}
	ev := got[0]
	if ev.ReportingController != "nodeguard-test" || ev.ReportingInstance != "nodeguard-test-test-host" || ev.Regarding.Name != node.Name {
		t.Errorf("event names controller %q, instance %q, regarding %q", ev.ReportingController, ev.ReportingInstance, ev.Regarding.Name)
	}
	// Recorded after the stop: dropped, not written and not blocking.
	rec.Eventf(node, nil, corev1.EventTypeNormal, "Late", "Test", "after the stop")
	if late := eventsAbout(t, node); len(late) != len(got) {
		t.Errorf("%d events after a late one, want %d", len(late), len(got))
	}
}

// A repeated event is one event whose series counts the repeats, as
// client-go's recorder writes it (a PATCH of the first). The object changing
// between repeats (a new resourceVersion) does not start a new series: a
// delete retried while other controllers write the node is one series.
func TestRepeatedEventsFormOneSeries(t *testing.T) {
	node := eventNode(t, "events-series")
	events := recorder.New(env.Client, env.Scheme, "test-host")
	rec := events.Recorder("nodeguard-test")
	for i := range 3 {
		rec.Eventf(node, nil, corev1.EventTypeWarning, "Repeated", "Test", "the same note")
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"test/written":"%d"}}}`, i)
		if err := env.Client.Patch(context.Background(), node, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	rec.Eventf(node, nil, corev1.EventTypeWarning, "Repeated", "Test", "another note")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := events.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]int32{}
	for _, ev := range eventsAbout(t, node) {
		count := int32(1)
		if ev.Series != nil {
			count = ev.Series.Count
		}
		got[ev.Note] += count
	}
	if want := map[string]int32{"the same note": 3, "another note": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("event counts by note = %v, want %v", got, want)
	}
	if n := len(eventsAbout(t, node)); n != 2 {
		t.Errorf("%d event objects, want 2 (one series and one single event)", n)
	}
}
