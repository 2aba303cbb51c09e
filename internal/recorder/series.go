package recorder

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
)

// series is an event written and the occurrences counted since; first's
// Series is what was written of them.
type series struct {
	first *eventsv1.Event
	count int32
	last  time.Time
}

// unwritten reports whether occurrences were counted since the last write.
func (s *series) unwritten() bool {
	written := int32(1)
	if s.first.Series != nil {
		written = s.first.Series.Count
	}
	return s.count > written
}

// seriesKey is what makes two events the same event: client-go's rule, but
// for the objects' resourceVersion (keyOf).
type seriesKey struct {
	controller, action, reason, note, eventType string
	regarding, related                          corev1.ObjectReference
}

// keyOf names the objects without their resourceVersion (as core/v1's event
// correlator does; client-go's events.k8s.io recorder keeps it): a node written
// between two denied deletes, which on a busy cluster is the rule, is still the
// same node, and the repeat joins the series. Combined events are one series
// whatever their note.
func keyOf(ev *eventsv1.Event) seriesKey {
	k := seriesKey{controller: ev.ReportingController, action: ev.Action, reason: ev.Reason,
		note: ev.Note, eventType: ev.Type, regarding: ev.Regarding}
	k.regarding.ResourceVersion = ""
	if strings.HasPrefix(ev.Note, combinedPrefix) {
		k.note = combinedPrefix
	}
	if ev.Related != nil {
		k.related = *ev.Related
		k.related.ResourceVersion = ""
	}
	return k
}

// similar are the notes of events that differ only in their note.
type similar struct {
	notes map[string]bool
	since time.Time
}

// combine returns the event as it is written: itself, or, past
// aggregateAfter similar events about its object, one combined event.
// events.k8s.io/v1 notes cannot change, so the combined event keeps the note
// of the first it combined and counts the rest.
func (w *writer) combine(ev *eventsv1.Event) *eventsv1.Event {
	k := similarKeyOf(ev)
	now := ev.EventTime.Time
	s := w.similar[k]
	if s == nil || now.Sub(s.since) >= aggregateWindow {
		s = &similar{notes: map[string]bool{}, since: now}
		w.similar[k] = s
	}
	if s.notes[ev.Note] || len(s.notes) < aggregateAfter {
		s.notes[ev.Note] = true
		return ev
	}
	combined := ev.DeepCopy()
	combined.Note = truncate(combinedPrefix + ev.Note)
	combined.Related = nil
	return combined
}

// similarKey is what makes two events similar: client-go's aggregator's key,
// without the note (and the related object, which the note names).
type similarKey struct {
	controller, action, reason, eventType string
	regarding                             corev1.ObjectReference
}

// similarKeyOf is the similarKey of an event, its objects named without
// their resourceVersion (keyOf).
func similarKeyOf(ev *eventsv1.Event) similarKey {
	k := similarKey{controller: ev.ReportingController, action: ev.Action, reason: ev.Reason, eventType: ev.Type, regarding: ev.Regarding}
	k.regarding.ResourceVersion = ""
	return k
}
