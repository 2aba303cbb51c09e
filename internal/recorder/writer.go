package recorder

import (
	"context"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writer writes the events of its share of the objects, in the order
// recorded. Only its goroutine uses its maps.
type writer struct {
	p     *Provider
	queue chan *eventsv1.Event
	done  chan struct{}
	// series are the events written within seriesWindow, by isomorphic key.
	series map[seriesKey]*series
	// similar counts the notes of similar events within aggregateWindow.
	similar map[similarKey]*similar
}

// run writes the writer's events as they come, and the counts of its series
// every seriesRefresh; once its queue is closed, the counts left.
func (w *writer) run() {
	defer close(w.done)
	tick := time.NewTicker(seriesRefresh)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-w.queue:
			if !ok {
				w.writeCounts()
				return
			}
			if w.p.writeCtx.Err() != nil {
				dropped.WithLabelValues(droppedStopped).Inc()
				continue
			}
			if err := w.writeOne(ev); err != nil {
				dropped.WithLabelValues(droppedWrite).Inc()
				ctrl.Log.WithName("events").Error(err, "Unable to write event", "reason", ev.Reason,
					"regarding", ev.Regarding.Name, "note", ev.Note)
			}
		case <-tick.C:
			w.writeCounts()
		}
	}
}

// writeOne creates the event, or counts it in the series of an isomorphic
// event written within seriesWindow: the second occurrence is written at
// once, later ones with the next refresh.
func (w *writer) writeOne(ev *eventsv1.Event) error {
	ev = w.combine(ev)
	key := keyOf(ev)
	now := ev.EventTime.Time
	if s, ok := w.series[key]; ok && now.Sub(s.last) < seriesWindow {
		s.count++
		s.last = now
		if s.first.Series != nil {
			return nil // with the next refresh
		}
		err := w.writeCount(s)
		if !apierrors.IsNotFound(err) {
			return err
		}
		// The first event is gone (deleted, or its TTL passed): start anew.
	}
	w.forgetOld(now)
	err := w.p.retry(func(ctx context.Context) error {
		err := w.p.client.Create(ctx, ev.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			return nil // an earlier attempt got through
		}
		return err
	})
	if err == nil {
		w.series[key] = &series{first: ev, count: 1, last: now}
	}
	return err
}

// writeCounts writes the counts of the series that grew since last written.
func (w *writer) writeCounts() {
	for key, s := range w.series {
		if !s.unwritten() || w.p.writeCtx.Err() != nil {
			continue
		}
		err := w.writeCount(s)
		switch {
		case apierrors.IsNotFound(err):
			delete(w.series, key) // gone: the next repeat starts anew
		case err != nil:
			ctrl.Log.WithName("events").Error(err, "Unable to write the count of an event series", "reason", s.first.Reason,
				"regarding", s.first.Regarding.Name, "count", s.count)
		}
	}
}

// writeCount patches the count and last time of a series.
func (w *writer) writeCount(s *series) error {
	updated := s.first.DeepCopy()
	updated.Series = &eventsv1.EventSeries{Count: s.count, LastObservedTime: metav1.NewMicroTime(s.last)}
	err := w.p.retry(func(ctx context.Context) error { return w.p.client.Patch(ctx, updated, client.MergeFrom(s.first)) })
	if err == nil {
		s.first.Series = updated.Series
	}
	return err
}

// retry runs write until it succeeds, fails for good, or writeAttempts ran.
func (p *Provider) retry(write func(context.Context) error) error {
	var err error
	for attempt := 0; attempt < writeAttempts; attempt++ {
		if err = write(p.writeCtx); err == nil || p.writeCtx.Err() != nil || !retriable(err) {
			return err
		}
		select {
		case <-p.writeCtx.Done():
			return err
		case <-time.After(wait.Jitter(retryDelay, 0.5)):
		}
	}
	return err
}

// retriable tells a failure worth another attempt from one that would fail
// the same way again.
func retriable(err error) bool {
	return !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err)
}

// forgetOld drops the series and similar counts past their windows, so the
// maps stay small; a series with a count not written yet is written first.
func (w *writer) forgetOld(now time.Time) {
	for k, s := range w.series {
		if now.Sub(s.last) < seriesWindow {
			continue
		}
		if s.unwritten() && w.writeCount(s) != nil {
			continue
		}
		delete(w.series, k)
	}
	for k, s := range w.similar {
		if now.Sub(s.since) >= aggregateWindow {
			delete(w.similar, k)
		}
	}
}
