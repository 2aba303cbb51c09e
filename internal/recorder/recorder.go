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
//
// This file holds the Provider, its settings and its queues; writer.go the
// writers (a write, its retries, a series' count); series.go what makes two
// events one series or similar, and the combining; eventrecorder.go the
// EventRecorder each controller records with.
package recorder

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
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
