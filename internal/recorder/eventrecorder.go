package recorder

import (
	"fmt"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/reference"
	ctrl "sigs.k8s.io/controller-runtime"
	crrecorder "sigs.k8s.io/controller-runtime/pkg/recorder"
)

// eventRecorder builds events for one controller.
type eventRecorder struct {
	provider   *Provider
	controller string
}

var _ crrecorder.EventRecorder = (*eventRecorder)(nil)

// Eventf records an event without annotations.
func (r *eventRecorder) Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any) {
	r.AnnotatedEventf(regarding, related, nil, eventType, reason, action, note, args...)
}

// AnnotatedEventf builds the event (its note formatted and cut to the API's
// limit) and queues it for its object's writer; it never blocks on a write.
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

// seriesName is a new event's name: unique per object and time, as
// client-go names them.
func seriesName(regarding string, t time.Time) string {
	return fmt.Sprintf("%s.%x", regarding, t.UnixNano())
}

// truncate cuts a note to the events.k8s.io/v1 limit.
func truncate(note string) string {
	if len(note) > noteLimit {
		return note[:noteLimit]
	}
	return note
}
