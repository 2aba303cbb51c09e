package taintwatch

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/requeue"
)

// involvedNameIndex indexes cached PreemptScheduled events by node name.
const involvedNameIndex = "involvedObject.name"

// PreemptScheduledSelector selects the events SpotTainter watches: reason
// PreemptScheduled about a Node. Events written through events.k8s.io/v1
// are the same objects, so core/v1 sees them too.
func PreemptScheduledSelector() fields.Selector {
	return fields.AndSelectors(
		fields.OneTermEqualSelector("reason", PreemptScheduledReason),
		fields.OneTermEqualSelector("involvedObject.kind", "Node"),
	)
}

// SpotTainter adds the spot-eviction taint to a node once a PreemptScheduled
// event names it. The taint is the record: a node that carries it is left
// alone, so duplicate events and restarts add nothing.
type SpotTainter struct {
	Client client.Client
	// Events reads PreemptScheduled events, indexed by involvedNameIndex
	// (see NewEventCache).
	Events   client.Reader
	Recorder events.EventRecorder
	Clock    clock.Clock
}

// NewEventCache returns a cache holding only PreemptScheduled events about
// Nodes (never all events), indexed by node name. Add it to the manager: it
// is started with the leader's runnables.
func NewEventCache(mgr ctrl.Manager) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
		HTTPClient: mgr.GetHTTPClient(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Event{}: {Field: PreemptScheduledSelector()},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating PreemptScheduled event cache: %w", err)
	}
	err = c.IndexField(context.Background(), &corev1.Event{}, involvedNameIndex, func(o client.Object) []string {
		return []string{o.(*corev1.Event).InvolvedObject.Name}
	})
	if err != nil {
		return nil, fmt.Errorf("indexing PreemptScheduled events: %w", err)
	}
	return c, nil
}

// SetupWithManager registers the tainter on the events of eventCache, keyed
// by node name.
func (s *SpotTainter) SetupWithManager(mgr ctrl.Manager, eventCache cache.Cache) error {
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
	s.Events = eventCache
	toNode := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, e *corev1.Event) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: e.InvolvedObject.Name}}}
	})
	isPreempt := predicate.NewTypedPredicateFuncs(preemptScheduled)
	return ctrl.NewControllerManagedBy(mgr).
		Named("signal-spot-eviction").
		WatchesRawSource(source.Kind(eventCache, &corev1.Event{}, toNode, isPreempt)).
		// A node's arrival in the cache looks at its events again: an event
		// that came first found no node to taint.
		Watches(&corev1.Node{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(nodeAdded())).
		Complete(s)
}

func nodeAdded() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// preemptScheduled double-checks what the field selector already selects.
func preemptScheduled(e *corev1.Event) bool {
	return e.Reason == PreemptScheduledReason && e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name != ""
}

// Reconcile taints the node when it lacks the taint and a PreemptScheduled
// event is about this very node (not an earlier node of the same name) and
// newer than the last one handled.
func (s *SpotTainter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := s.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if hasSpotTaint(&node) {
		spotChecks.WithLabelValues(resultAlreadyTainted).Inc()
		return reconcile.Result{}, nil
	}
	ev, newest, err := s.newEvent(ctx, &node)
	if err != nil {
		return reconcile.Result{}, err
	}
	if ev == nil {
		spotChecks.WithLabelValues(resultNoEvent).Inc()
		return reconcile.Result{}, nil
	}
	// Optimistic lock: taints are replaced as a whole, and a reconcile that
	// read a node from before our own patch must not add the taint twice.
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	addSpotTaint(&node)
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.SpotEventHandledAnnotation] = ngv1alpha1.FormatTime(newest)
	if err := s.Client.Patch(ctx, &node, patch); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return reconcile.Result{}, nil
		case apierrors.IsConflict(err):
			// Our cache was behind (often: behind our own patch); look again.
			return reconcile.Result{RequeueAfter: requeue.AfterConflict}, nil
		}
		return reconcile.Result{}, fmt.Errorf("adding spot-eviction taint to node %s: %w", node.Name, err)
	}
	spotTaintsAdded.Inc()
	spotChecks.WithLabelValues(resultTainted).Inc()
	ctrl.LoggerFrom(ctx).Info("Added spot-eviction taint after PreemptScheduled event", "node", klog.KObj(&node), "event", klog.KObj(ev))
	if s.Recorder != nil {
		t := SpotEvictionTaint()
		s.Recorder.Eventf(&node, nil, corev1.EventTypeNormal, ReasonSpotEvictionTaintAdded, actionSpotTaint,
			"Added taint %s=%s:%s after event %s/%s (%s): %s", t.Key, t.Value, t.Effect, ev.Namespace, ev.Name, PreemptScheduledReason, ev.Message)
	}
	return reconcile.Result{}, nil
}

// newEvent returns the first PreemptScheduled event that applies to node,
// and the creation time of the newest one, or nil when none applies.
func (s *SpotTainter) newEvent(ctx context.Context, node *corev1.Node) (*corev1.Event, time.Time, error) {
	var list corev1.EventList
	if err := s.Events.List(ctx, &list, client.MatchingFields{involvedNameIndex: node.Name}); err != nil {
		return nil, time.Time{}, fmt.Errorf("listing PreemptScheduled events of node %s: %w", node.Name, err)
	}
	var handled time.Time
	if v, ok := node.Annotations[ngv1alpha1.SpotEventHandledAnnotation]; ok {
		handled, _ = ngv1alpha1.ParseTime(v) // unparsable: zero, nothing handled
	}
	var first *corev1.Event
	var newest time.Time
	for i := range list.Items {
		e := &list.Items[i]
		if !appliesTo(e, node) || !e.CreationTimestamp.After(handled) {
			continue
		}
		if first == nil || e.CreationTimestamp.Before(&first.CreationTimestamp) {
			first = e
		}
		if e.CreationTimestamp.After(newest) {
			newest = e.CreationTimestamp.Time
		}
	}
	return first, newest, nil
}

// appliesTo: the event names this node, not an earlier node of the same name
// (by UID when the event has one, else by time: an event older than the node
// is about its predecessor).
func appliesTo(e *corev1.Event, node *corev1.Node) bool {
	if !preemptScheduled(e) || e.InvolvedObject.Name != node.Name {
		return false
	}
	if e.InvolvedObject.UID != "" {
		return e.InvolvedObject.UID == node.UID
	}
	return !e.CreationTimestamp.Before(&node.CreationTimestamp)
}

// hasSpotTaint: the node carries the spot-eviction taint (any effect),
// whether or not --signal-taints lists it.
func hasSpotTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == ngv1alpha1.SpotEvictionTaintKey && t.Value == ngv1alpha1.SpotEvictionTaintValue {
			return true
		}
	}
	return false
}

// addSpotTaint adds the taint, or sets its value on a taint with the same key
// and effect (the API server allows only one).
func addSpotTaint(n *corev1.Node) {
	want := SpotEvictionTaint()
	for i, t := range n.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			n.Spec.Taints[i].Value = want.Value
			return
		}
	}
	n.Spec.Taints = append(n.Spec.Taints, want)
}
