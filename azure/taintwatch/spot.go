package taintwatch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
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
	"github.com/nodeguard/nodeguard/kube/requeue"
)

// involvedNameIndex indexes cached PreemptScheduled events by node name.
const involvedNameIndex = "involvedObject.name"

// spotLabel selects spot nodes, the only ones Azure preempts.
const spotLabel = ngv1alpha1.SpotPriorityLabel + "=" + ngv1alpha1.SpotPriorityValue

// PreemptScheduledSelector selects the events SpotTainter watches: reason
// PreemptScheduled about a Node. Events written through events.k8s.io/v1
// are the same objects, so core/v1 sees them too.
func PreemptScheduledSelector() fields.Selector {
	return fields.AndSelectors(
		fields.OneTermEqualSelector("reason", PreemptScheduledReason),
		fields.OneTermEqualSelector("involvedObject.kind", "Node"),
	)
}

// Who writes the notice on AKS, from public sources (see also
// DefaultSpotEventComponent):
//
//   - node-problem-detector, a systemd service on every node (AKS docs
//     "Node Problem Detector (NPD) in AKS nodes" list PreemptScheduled among
//     its CustomPluginMonitor events). A node's process list, posted
//     publicly, shows it run with
//     --apiserver-override=...?inClusterConfig=false&auth=/var/lib/kubelet/kubeconfig
//     (the kubelet's identity, system:node:<node>), --hostname-override=<node>,
//     no --event-namespace, and the monitor
//     custom-scheduledevents-consolidated-preempt-plugin-monitor.json
//     (plugin check_preempt.sh, which asks IMDS for Preempt scheduled
//     events); `kubectl describe node` output, also public, shows its event
//     as "Warning PreemptScheduled ... custom-scheduledevents-consolidated-preempt-plugin-monitor".
//   - Its k8s exporter (kubernetes/node-problem-detector,
//     pkg/exporters/k8sexporter/problemclient/problem_client.go) records
//     with client-go's legacy recorder: source {component: the monitor's
//     source, host: the node}, copied to reportingController and
//     reportingInstance (client-go tools/record/event.go); involvedObject
//     {kind Node, apiVersion v1, name: the node, namespace: ""}, with the
//     node's UID only in versions from 2026-07 on. The recorder writes the
//     event of an object without a namespace to "default" (makeEvent).
//   - A temporary rule reports every non-OK exit of its plugin
//     (pkg/custompluginmonitor), so an IMDS timeout becomes a
//     PreemptScheduled event too ("IMDS query failed, exit code: 28"),
//     seen on a node that was not preempted: appliesTo skips it.
//
// So a notice counts only from that namespace and writer, and from the node
// itself: a tenant with `edit` in its own namespace may create an Event naming
// any Node, but only in its namespace. Whoever may create Events in "default"
// (cluster administrators, every node's kubelet identity, controllers granted
// Events cluster-wide) can still forge one: the notice must then also be
// about a spot node nodeguard manages, and the expiry undoes it on a node
// that keeps running.

// noticeWriter says which PreemptScheduled events are Azure's notices.
type noticeWriter struct {
	namespace string
	// components: the event's reportingController (else source.component)
	// is one of them; empty: any.
	components []string
}

// wrote: e was written where and by whom notices are, from the node itself.
func (w noticeWriter) wrote(e *corev1.Event, node string) bool {
	component, host := e.ReportingController, e.ReportingInstance
	if component == "" { // a client that predates reportingController
		component, host = e.Source.Component, e.Source.Host
	}
	return e.Namespace == w.namespace && host == node && (len(w.components) == 0 || slices.Contains(w.components, component))
}

// SpotTainter adds the spot-eviction taint to a spot node once a trusted
// PreemptScheduled event names it, and removes the taint it added once the
// node outlived the notice. The taint is the record: a node that carries it
// is left alone, so duplicate events and restarts add nothing.
type SpotTainter struct {
	Client client.Client
	// Events reads PreemptScheduled events, indexed by involvedNameIndex
	// (see NewEventCache).
	Events   client.Reader
	Recorder events.EventRecorder
	Clock    clock.Clock
	// Writer is where and by whom trusted notices are written.
	Writer noticeWriter
	// Managed selects the nodes that may be tainted; nil: every node.
	Managed labels.Selector
	// Expiry: a node still running this long after the notice has the taint
	// removed; 0 never.
	Expiry time.Duration
}

// NewEventCache returns a cache holding only PreemptScheduled events about
// Nodes in namespace (never all events), indexed by node name. Add it to the
// manager: it is started with the leader's runnables.
func NewEventCache(mgr ctrl.Manager, namespace string) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:     mgr.GetScheme(),
		Mapper:     mgr.GetRESTMapper(),
		HTTPClient: mgr.GetHTTPClient(),
		// Events elsewhere are no notice: never read them.
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
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
	if s.Managed == nil {
		s.Managed = labels.Everything()
	}
	s.Events = eventCache
	toNode := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, e *corev1.Event) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: e.InvolvedObject.Name}}}
	})
	isPreempt := predicate.NewTypedPredicateFuncs(preemptScheduled)
	return ctrl.NewControllerManagedBy(mgr).
		Named("signal-spot-eviction").
		WatchesRawSource(source.Kind(eventCache, &corev1.Event{}, toNode, isPreempt)).
		Watches(&corev1.Node{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(s.nodeChanges())).
		Complete(s)
}

// nodeChanges: a node's arrival in the cache looks at its events again (an
// event that came first found no node to taint); an update of a node carrying
// nodeguard's taint may be the kubelet status that shows it outlived the
// notice.
func (s *SpotTainter) nodeChanges() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			n, ok := e.ObjectNew.(*corev1.Node)
			return ok && s.Expiry > 0 && ownSpotTaint(n) != nil
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// preemptScheduled double-checks what the field selector already selects.
func preemptScheduled(e *corev1.Event) bool {
	return e.Reason == PreemptScheduledReason && e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name != ""
}

// Reconcile taints the node when it lacks the taint and a trusted
// PreemptScheduled event is about this very node (not an earlier node of the
// same name) and newer than the last one handled, and the node is a spot node
// nodeguard may taint. A taint nodeguard added comes off once the node
// outlived the notice (expire).
func (s *SpotTainter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := s.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if hasSpotTaint(&node) {
		if t := ownSpotTaint(&node); t != nil && s.Expiry > 0 {
			return s.expire(ctx, &node, t.TimeAdded.Time)
		}
		spotChecks.WithLabelValues(resultAlreadyTainted).Inc()
		return reconcile.Result{}, nil
	}
	ev, newest, err := s.newEvent(ctx, &node)
	if err != nil {
		return reconcile.Result{}, err
	}
	switch {
	case ev == nil:
		spotChecks.WithLabelValues(resultNoEvent).Inc()
		return reconcile.Result{}, nil
	case node.Labels[ngv1alpha1.SpotPriorityLabel] != ngv1alpha1.SpotPriorityValue:
		// Azure preempts spot VMs only: a notice about another node is false.
		spotChecks.WithLabelValues(resultNotSpot).Inc()
		return reconcile.Result{}, nil
	case !s.Managed.Matches(labels.Set(node.Labels)):
		spotChecks.WithLabelValues(resultNotSelected).Inc()
		return reconcile.Result{}, nil
	}
	// A notice seen late (nodeguard was down) on a node that outlived it is
	// recorded as handled but adds no taint: that would only cut the node's
	// traffic to restore it at once.
	heartbeat, outlived := s.outlived(&node, newest)
	// Optimistic lock: taints are replaced as a whole, and a reconcile that
	// read a node from before our own patch must not add the taint twice.
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if !outlived {
		addSpotTaint(&node, newest)
	}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[ngv1alpha1.SpotEventHandledAnnotation] = ngv1alpha1.FormatTime(newest)
	if ok, res, err := s.patch(ctx, &node, patch, "adding spot-eviction taint to"); !ok {
		return res, err
	}
	if outlived {
		s.reportExpired(ctx, &node, newest, heartbeat, false)
		return reconcile.Result{}, nil
	}
	spotTaintsAdded.Inc()
	spotChecks.WithLabelValues(resultTainted).Inc()
	ctrl.LoggerFrom(ctx).Info("Added spot-eviction taint after PreemptScheduled event", "node", klog.KObj(&node), "event", klog.KObj(ev))
	if s.Recorder != nil {
		t := SpotEvictionTaint()
		s.Recorder.Eventf(&node, nil, corev1.EventTypeNormal, ReasonSpotEvictionTaintAdded, actionSpotTaint,
			"Added taint %s=%s:%s after event %s/%s (%s): %s", t.Key, t.Value, t.Effect, ev.Namespace, ev.Name, PreemptScheduledReason, ev.Message)
	}
	if s.Expiry > 0 {
		return reconcile.Result{RequeueAfter: newest.Add(s.Expiry).Sub(s.Clock.Now())}, nil
	}
	return reconcile.Result{}, nil
}

// expire removes nodeguard's taint, added for the notice of noticeAt, once
// the node outlived it; until then it waits for the deadline, then for a
// kubelet status after it (a node update).
func (s *SpotTainter) expire(ctx context.Context, node *corev1.Node, noticeAt time.Time) (reconcile.Result, error) {
	if wait := noticeAt.Add(s.Expiry).Sub(s.Clock.Now()); wait > 0 {
		spotChecks.WithLabelValues(resultAlreadyTainted).Inc()
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	heartbeat, outlived := s.outlived(node, noticeAt)
	if !outlived {
		spotChecks.WithLabelValues(resultAlreadyTainted).Inc()
		return reconcile.Result{}, nil
	}
	patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return isOwnSpotTaint(node, t) })
	if ok, res, err := s.patch(ctx, node, patch, "removing spot-eviction taint from"); !ok {
		return res, err
	}
	s.reportExpired(ctx, node, noticeAt, heartbeat, true)
	return reconcile.Result{}, nil
}

// outlived reports whether, Expiry after the notice of noticeAt, the node is
// Ready with a kubelet status posted then or later, and that status's time.
// Azure evicts 30 s after a notice: a kubelet that still posts status
// minutes later runs on a VM that was not evicted. (Whether the VM exists
// would not say it: a spot pool's Deallocate policy keeps the stopped VM.)
func (s *SpotTainter) outlived(node *corev1.Node, noticeAt time.Time) (time.Time, bool) {
	if s.Expiry <= 0 {
		return time.Time{}, false
	}
	deadline := noticeAt.Add(s.Expiry)
	if s.Clock.Now().Before(deadline) {
		return time.Time{}, false
	}
	if c := ngv1alpha1.ReadyCondition(node); c != nil {
		return c.LastHeartbeatTime.Time, c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(deadline)
	}
	return time.Time{}, false
}

// patch writes the node: ok when it did. Otherwise res and err are what
// Reconcile returns: a conflict (our cache was behind, often behind our own
// patch) looks again, a node gone ends the matter.
func (s *SpotTainter) patch(ctx context.Context, node *corev1.Node, patch client.Patch, what string) (ok bool, res reconcile.Result, err error) {
	err = s.Client.Patch(ctx, node, patch)
	if again, lost := requeue.OnConflict(err); lost {
		return false, again, nil
	}
	switch {
	case err == nil:
		return true, reconcile.Result{}, nil
	case apierrors.IsNotFound(err):
		return false, reconcile.Result{}, nil
	}
	return false, reconcile.Result{}, fmt.Errorf("%s node %s: %w", what, node.Name, err)
}

func (s *SpotTainter) reportExpired(ctx context.Context, node *corev1.Node, noticeAt, heartbeat time.Time, removed bool) {
	spotChecks.WithLabelValues(resultNoticeExpired).Inc()
	done := "Removed the spot-eviction taint nodeguard added"
	if !removed {
		done = "Did not add the spot-eviction taint"
	}
	ctrl.LoggerFrom(ctx).Info(done+": the node outlived the PreemptScheduled notice", "node", klog.KObj(node),
		"notice", noticeAt, "kubeletStatus", heartbeat, "expiry", s.Expiry)
	if s.Recorder != nil {
		s.Recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonSpotEvictionNoticeExpired, actionSpotUntaint,
			"%s: the node is Ready and its kubelet posted status at %s, more than %s after the %s notice of %s (Azure evicts a spot VM 30 s after its notice), so the notice was false",
			done, heartbeat.UTC().Format(time.RFC3339), s.Expiry, PreemptScheduledReason, noticeAt.UTC().Format(time.RFC3339))
	}
}

// newEvent returns the first trusted PreemptScheduled event that applies to
// node, and the creation time of the newest one, or nil when none applies.
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
		if !appliesTo(e, node) || !s.Writer.wrote(e, node.Name) || !e.CreationTimestamp.After(handled) {
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

// appliesTo: the event is a notice naming this node, not an earlier node of
// the same name (by UID when the event has one, else by time: an event older
// than the node is about its predecessor).
func appliesTo(e *corev1.Event, node *corev1.Node) bool {
	if !preemptScheduled(e) || e.InvolvedObject.Name != node.Name || strings.HasPrefix(e.Message, imdsFailedPrefix) {
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

// addSpotTaint adds the taint, dated noticeAt, or sets its value on a taint
// with the same key and effect (the API server allows only one). Only the
// taint it adds is dated: the date, equal to SpotEventHandledAnnotation, is
// how nodeguard knows the taint for its own (ownSpotTaint), never a taint
// someone else added or changed after.
func addSpotTaint(n *corev1.Node, noticeAt time.Time) {
	want := SpotEvictionTaint()
	for i, t := range n.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			n.Spec.Taints[i].Value = want.Value
			return
		}
	}
	want.TimeAdded = &metav1.Time{Time: noticeAt}
	n.Spec.Taints = append(n.Spec.Taints, want)
}

// ownSpotTaint returns the spot-eviction taint nodeguard added, or nil.
func ownSpotTaint(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if isOwnSpotTaint(n, n.Spec.Taints[i]) {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// isOwnSpotTaint: t is the spot-eviction taint dated (to the second, as the
// API stores it) with the notice time nodeguard recorded when it added it.
func isOwnSpotTaint(n *corev1.Node, t corev1.Taint) bool {
	noticeAt, ok := ngv1alpha1.AnnotationTime(n, ngv1alpha1.SpotEventHandledAnnotation)
	want := SpotEvictionTaint()
	return ok && t.Key == want.Key && t.Value == want.Value && t.Effect == want.Effect &&
		t.TimeAdded != nil && t.TimeAdded.Unix() == noticeAt.Unix()
}
