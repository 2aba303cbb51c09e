// Package recorder records nodeguard's Kubernetes events (events.k8s.io/v1).
//
// client-go's event broadcaster writes each event from a goroutine of its own
// and cancels them all when it shuts down, so an event recorded just before
// nodeguard stops (a spot taint added, a drain given up) can be lost. This
// recorder writes from a few queues instead, each object's events from one
// (in the order recorded), and Flush writes out what is queued before the
// process exits.
//
// Every event is a write that every watcher of events receives, and a
// fleet's deletion records some per node. As client-go's recorders do, a
// repeat of an event counts in the series of the first (written at once for
// the second occurrence, then at most every seriesRefresh), and past
// aggregateAfter events that differ only in their note about one object
// within aggregateWindow, the rest are combined into one series.
package recorder

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/reference"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	crrecorder "sigs.k8s.io/controller-runtime/pkg/recorder"
)

const (
	// writers write events in parallel, each object's from one of them;
	// queueSize bounds the events waiting for each, more are dropped (and
	// counted) rather than block a controller.
	writers   = 4
	queueSize = 1000
	// seriesWindow is how long a repeat of an event joins the first one's
	// series instead of creating a new event (client-go's value).
	seriesWindow = 6 * time.Minute
	// seriesRefresh spaces the writes of a series' count after its second
	// occurrence (client-go's events.k8s.io recorder: 30 minutes).
	seriesRefresh = time.Minute
	// aggregateAfter and aggregateWindow are client-go's event aggregator's:
	// past 10 similar events about one object within 10 minutes, the rest
	// are combined.
	aggregateAfter  = 10
	aggregateWindow = 10 * time.Minute
	// combinedPrefix starts the note of a combined event (client-go's words).
	combinedPrefix = "(combined from similar events): "
	// noteLimit is the events.k8s.io/v1 limit on a note.
	noteLimit = 1024
	// writeAttempts and retryDelay bound the retries of one write.
	writeAttempts = 3
	retryDelay    = 500 * time.Millisecond
)

// Reasons an event was not written, the values of the "reason" label.
const (
	droppedQueueFull = "queue_full"
	droppedStopped   = "stopped"
	droppedWrite     = "write_failed"
)

var dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nodeguard_events_dropped_total",
	Help: "Kubernetes events nodeguard recorded but did not write, by reason (queue_full, stopped, write_failed).",
}, []string{"reason"})

func init() { metrics.Registry.MustRegister(dropped) }

// Provider hands out event recorders that share its writers.
type Provider struct {
	client client.Client
	scheme *runtime.Scheme
	clock  clock.PassiveClock
	host   string

	mu      sync.Mutex
	stopped bool
	writers []*writer
	// writeCtx ends the writes in progress when a flush runs out of time.
	writeCtx    context.Context
	cancelWrite context.CancelFunc
}

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

// similar are the notes of events that differ only in their note.
type similar struct {
	notes map[string]bool
	since time.Time
}

// New starts a provider that writes events through c. host names this replica:
// an event's reportingInstance is its controller, "-" and host, as client-go's.
func New(c client.Client, scheme *runtime.Scheme, host string) *Provider {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Provider{client: c, scheme: scheme, clock: clock.RealClock{}, host: host, writeCtx: ctx, cancelWrite: cancel}
	for range writers {
		w := &writer{p: p, queue: make(chan *eventsv1.Event, queueSize), done: make(chan struct{}),
			series: map[seriesKey]*series{}, similar: map[similarKey]*similar{}}
		p.writers = append(p.writers, w)
		go w.run()
	}
	return p
}

// ForManager starts a provider that writes through a client of its own (so
// events never wait on the controllers' client-side rate limit), and returns the
// manager with its GetEventRecorder answered by the provider.
func ForManager(mgr manager.Manager) (manager.Manager, *Provider, error) {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the events client: %w", err)
	}
	host, _ := os.Hostname()
	p := New(c, mgr.GetScheme(), host)
	return managerWithEvents{Manager: mgr, events: p}, p, nil
}

// managerWithEvents is a manager whose recorders are a Provider's.
type managerWithEvents struct {
	manager.Manager
	events *Provider
}

func (m managerWithEvents) GetEventRecorder(name string) crrecorder.EventRecorder {
	return m.events.Recorder(name)
}

// Recorder returns a recorder whose events name controller as their
// reportingController.
func (p *Provider) Recorder(controller string) crrecorder.EventRecorder {
	return &eventRecorder{provider: p, controller: controller}
}

// Flush stops taking events and writes out the queued ones and the counts of
// their series, until ctx ends.
func (p *Provider) Flush(ctx context.Context) error {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		for _, w := range p.writers {
			close(w.queue)
		}
	}
	p.mu.Unlock()
	for _, w := range p.writers {
		select {
		case <-w.done:
		case <-ctx.Done():
			p.cancelWrite() // the writers count what is left as dropped
			for _, w := range p.writers {
				<-w.done
			}
			return fmt.Errorf("writing queued events: %w", ctx.Err())
		}
	}
	return nil
}

// enqueue takes an event for writing without blocking the caller.
func (p *Provider) enqueue(ev *eventsv1.Event) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(ev.Regarding.Kind + "/" + ev.Regarding.Namespace + "/" + ev.Regarding.Name))
	w := p.writers[h.Sum32()%uint32(len(p.writers))]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		dropped.WithLabelValues(droppedStopped).Inc()
		return
	}
	select {
	case w.queue <- ev:
	default:
		dropped.WithLabelValues(droppedQueueFull).Inc()
	}
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

// similarKey is what makes two events similar: client-go's aggregator's key,
// without the note (and the related object, which the note names).
type similarKey struct {
	controller, action, reason, eventType string
	regarding                             corev1.ObjectReference
}

func similarKeyOf(ev *eventsv1.Event) similarKey {
	k := similarKey{controller: ev.ReportingController, action: ev.Action, reason: ev.Reason, eventType: ev.Type, regarding: ev.Regarding}
	k.regarding.ResourceVersion = ""
	return k
}

func truncate(note string) string {
	if len(note) > noteLimit {
		return note[:noteLimit]
	}
	return note
}

func seriesName(regarding string, t time.Time) string {
	return fmt.Sprintf("%s.%x", regarding, t.UnixNano())
}

// eventRecorder builds events for one controller.
type eventRecorder struct {
	provider   *Provider
	controller string
}

var _ crrecorder.EventRecorder = (*eventRecorder)(nil)

func (r *eventRecorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventType, reason, action, note, args...)
}

func (r *eventRecorder) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string,
	eventType, reason, action, note string, args ...any) {
	log := ctrl.Log.WithName("events")
	ref, err := reference.GetReference(r.provider.scheme, regarding)
	if err != nil {
		log.Error(err, "Cannot reference the object of an event", "reason", reason)
		return
	}
	if len(args) > 0 {
		note = fmt.Sprintf(note, args...)
	}
	note = truncate(note)
	now := r.provider.clock.Now()
	namespace := ref.Namespace
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: seriesName(ref.Name, now), Namespace: namespace, Annotations: annotations},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.controller,
		ReportingInstance:   r.controller + "-" + r.provider.host,
		Action:              action,
		Reason:              reason,
		Regarding:           *ref,
		Note:                note,
		Type:                eventType,
	}
	if related != nil {
		if rel, err := reference.GetReference(r.provider.scheme, related); err == nil {
			ev.Related = rel
		}
	}
	log.V(1).Info(note, "type", eventType, "reason", reason, "object", ref.Name)
	r.provider.enqueue(ev)
}
