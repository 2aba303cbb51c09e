// Package recorder records nodeguard's Kubernetes events (events.k8s.io/v1).
//
// client-go's event broadcaster writes each event from a goroutine of its own
// and cancels them all when it shuts down, so an event recorded just before
// nodeguard stops (a spot taint added, a drain given up) can be lost. This
// recorder writes from one queue instead, and Flush writes out what is queued
// before the process exits.
package recorder

import (
	"context"
	"fmt"
	"os"
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
	// queueSize bounds the events waiting to be written; more are dropped
	// (and counted) rather than block a controller.
	queueSize = 1000
	// seriesWindow is how long a repeat of an event updates the first one's
	// series instead of creating a new event (client-go's value).
	seriesWindow = 6 * time.Minute
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

// Provider hands out event recorders that share one write queue.
type Provider struct {
	client client.Client
	scheme *runtime.Scheme
	clock  clock.PassiveClock
	host   string

	mu      sync.Mutex
	stopped bool
	queue   chan *eventsv1.Event
	// writeCtx ends the writes in progress when a flush runs out of time.
	writeCtx    context.Context
	cancelWrite context.CancelFunc
	done        chan struct{}
	// series are the events written within seriesWindow, by isomorphic key;
	// only the writer goroutine uses it.
	series map[seriesKey]*eventsv1.Event
}

// New starts a provider that writes events through c. host names this replica:
// an event's reportingInstance is its controller, "-" and host, as client-go's.
func New(c client.Client, scheme *runtime.Scheme, host string) *Provider {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Provider{
		client: c, scheme: scheme, clock: clock.RealClock{}, host: host,
		queue: make(chan *eventsv1.Event, queueSize), writeCtx: ctx, cancelWrite: cancel,
		done: make(chan struct{}), series: map[seriesKey]*eventsv1.Event{},
	}
	go p.write()
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

// Flush stops taking events and writes out the queued ones, until ctx ends.
func (p *Provider) Flush(ctx context.Context) error {
	p.mu.Lock()
	if !p.stopped {
		p.stopped = true
		close(p.queue)
	}
	p.mu.Unlock()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		p.cancelWrite() // the writer counts what is left as dropped
		<-p.done
		return fmt.Errorf("writing queued events: %w", ctx.Err())
	}
}

// enqueue takes an event for writing without blocking the caller.
func (p *Provider) enqueue(ev *eventsv1.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		dropped.WithLabelValues(droppedStopped).Inc()
		return
	}
	select {
	case p.queue <- ev:
	default:
		dropped.WithLabelValues(droppedQueueFull).Inc()
	}
}

// write is the one goroutine that writes events, in the order recorded.
func (p *Provider) write() {
	defer close(p.done)
	for ev := range p.queue {
		if p.writeCtx.Err() != nil {
			dropped.WithLabelValues(droppedStopped).Inc()
			continue
		}
		if err := p.writeOne(ev); err != nil {
			dropped.WithLabelValues(droppedWrite).Inc()
			ctrl.Log.WithName("events").Error(err, "Unable to write event", "reason", ev.Reason,
				"regarding", ev.Regarding.Name, "note", ev.Note)
		}
	}
}

// writeOne creates the event, or counts it in the series of an identical
// event written within seriesWindow.
func (p *Provider) writeOne(ev *eventsv1.Event) error {
	key := keyOf(ev)
	now := ev.EventTime.Time
	if first, ok := p.series[key]; ok && now.Sub(lastSeen(first)) < seriesWindow {
		err := p.retry(func(ctx context.Context) error { return p.addToSeries(ctx, first, now) })
		if !apierrors.IsNotFound(err) {
			return err
		}
		// The first event is gone (deleted, or its TTL passed): start anew.
	}
	p.forgetOldSeries(now)
	err := p.retry(func(ctx context.Context) error {
		err := p.client.Create(ctx, ev.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			return nil // an earlier attempt got through
		}
		return err
	})
	if err == nil {
		p.series[key] = ev
	}
	return err
}

// addToSeries patches the count and last time of first's series.
func (p *Provider) addToSeries(ctx context.Context, first *eventsv1.Event, now time.Time) error {
	count := int32(2)
	if first.Series != nil {
		count = first.Series.Count + 1
	}
	updated := first.DeepCopy()
	updated.Series = &eventsv1.EventSeries{Count: count, LastObservedTime: metav1.NewMicroTime(now)}
	if err := p.client.Patch(ctx, updated, client.MergeFrom(first)); err != nil {
		return err
	}
	first.Series = updated.Series
	return nil
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

// forgetOldSeries drops series older than the window, so the map stays small.
func (p *Provider) forgetOldSeries(now time.Time) {
	for k, ev := range p.series {
		if now.Sub(lastSeen(ev)) >= seriesWindow {
			delete(p.series, k)
		}
	}
}

func lastSeen(ev *eventsv1.Event) time.Time {
	if ev.Series != nil {
		return ev.Series.LastObservedTime.Time
	}
	return ev.EventTime.Time
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
// same node, and the repeat joins the series.
func keyOf(ev *eventsv1.Event) seriesKey {
	k := seriesKey{controller: ev.ReportingController, action: ev.Action, reason: ev.Reason,
		note: ev.Note, eventType: ev.Type, regarding: ev.Regarding}
	k.regarding.ResourceVersion = ""
	if ev.Related != nil {
		k.related = *ev.Related
		k.related.ResourceVersion = ""
	}
	return k
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
	if len(note) > noteLimit {
		note = note[:noteLimit]
	}
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
