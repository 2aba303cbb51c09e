package v1alpha1

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The rules about nodes that several parts of nodeguard apply. Each is written
// once, here, so that the budget, the admin state, the taint watcher and the
// termination never disagree.

// SignalTaint is a taint that says a node is leaving or has gone: while a node
// carries one, its load-balancer traffic is cut and budgets count it
// unavailable.
// +kubebuilder:object:generate=false
type SignalTaint struct {
	Key string
	// Value, when set, is the only value that counts.
	Value string
	// Signal names it in metrics and events.
	Signal string
}

// DefaultSignalTaints are the signal taints nodeguard starts with (the
// --signal-taints default), in the order metrics list them.
var DefaultSignalTaints = []SignalTaint{
	{Key: OutOfServiceTaintKey, Signal: "out_of_service"},
	{Key: CloudShutdownTaintKey, Signal: "shutdown"},
	{Key: SpotEvictionTaintKey, Value: SpotEvictionTaintValue, Signal: "spot_eviction"},
	{Key: ClusterAutoscalerTaintKey, Signal: "cluster_autoscaler"},
	{Key: KarpenterDisruptedTaintKey, Signal: "karpenter_disrupted"},
}

// CloudProviderSignalTaints are the taints cloud-provider-azure's admin-state
// design (kubernetes-sigs/cloud-provider-azure#9633, PR #9634) sets Down on,
// restoring None once all are gone. nodeguard never restores None while one
// is on a node, whatever --signal-taints says, so the two never disagree.
var CloudProviderSignalTaints = DefaultSignalTaints[:3:3]

// Signals is what the process was told about signal taints: the table
// (--signal-taints) and whether cluster-autoscaler's scale-downs are charged
// to budgets (--cluster-autoscaler-scale-down-hold). main builds it once and
// hands it to each component that reads it; a nil *Signals is the defaults.
// +kubebuilder:object:generate=false
type Signals struct {
	taints          []SignalTaint
	scaleDownClaims bool
}

// NewSignals returns the configuration of signal taints.
func NewSignals(taints []SignalTaint, scaleDownClaims bool) *Signals {
	return &Signals{taints: slices.Clone(taints), scaleDownClaims: scaleDownClaims}
}

var defaultSignals = NewSignals(DefaultSignalTaints, true)

func (s *Signals) or() *Signals {
	if s == nil {
		return defaultSignals
	}
	return s
}

// Taints returns the signal taints, in the order metrics list them. Callers
// must not modify it.
func (s *Signals) Taints() []SignalTaint { return s.or().taints }

// ScaleDownClaims reports whether cluster-autoscaler's scale-downs are charged
// to budgets.
func (s *Signals) ScaleDownClaims() bool { return s.or().scaleDownClaims }

// Matches reports whether a taint is this signal taint.
func (s SignalTaint) Matches(t corev1.Taint) bool {
	return t.Key == s.Key && (s.Value == "" || t.Value == s.Value)
}

// String is the taint as --signal-taints spells it: key or key=value.
func (s SignalTaint) String() string {
	if s.Value == "" {
		return s.Key
	}
	return s.Key + "=" + s.Value
}

// Of returns the configured signal taint that a taint is, if it is one.
func (s *Signals) Of(t corev1.Taint) (SignalTaint, bool) {
	for _, st := range s.Taints() {
		if st.Matches(t) {
			return st, true
		}
	}
	return SignalTaint{}, false
}

// HoldsAdminState reports whether a node carries a signal taint that
// nodeguard (the configured ones) or cloud-provider-azure honours: while it
// does, nodeguard restores None on none of its entries.
func (s *Signals) HoldsAdminState(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if _, ok := s.Of(t); ok {
			return true
		}
		for _, cp := range CloudProviderSignalTaints {
			if cp.Matches(t) {
				return true
			}
		}
	}
	return false
}

// ParseSignalTaints parses --signal-taints: comma-separated key or key=value
// (the value, when given, is the only one that counts). An empty string is no
// signal taints. A default taint keeps its signal name; any other is named by
// its key. Keys must be valid taint keys and appear once; values valid label
// values.
func ParseSignalTaints(spec string) ([]SignalTaint, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	var out []SignalTaint
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		key, value, _ := strings.Cut(strings.TrimSpace(item), "=")
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("signal taint %q: key %s", item, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, fmt.Errorf("signal taint %q: value %s", item, strings.Join(errs, "; "))
		}
		if seen[key] {
			return nil, fmt.Errorf("signal taint %q: key %s listed twice", item, key)
		}
		seen[key] = true
		out = append(out, SignalTaint{Key: key, Value: value, Signal: signalName(key)})
	}
	return out, nil
}

// signalName is a default taint's signal name, or the key of any other.
func signalName(key string) string {
	for _, s := range DefaultSignalTaints {
		if s.Key == key {
			return s.Signal
		}
	}
	return key
}

// FormatSignalTaints spells a table as --signal-taints takes it.
func FormatSignalTaints(taints []SignalTaint) string {
	out := make([]string, 0, len(taints))
	for _, s := range taints {
		out = append(out, s.String())
	}
	return strings.Join(out, ",")
}

// AwaitsDisruptionClaim reports whether t is the taint of an autoscaler that
// disrupts the node only once nodeguard charged the disruption to the node's
// budgets. Such a taint cuts traffic (it is a signal) but does not by itself
// make the node count unavailable: an autoscaler taints several nodes at once,
// and counting them all would let the budget's unhealthy-node rule wave every
// one through, or leave no room for the first.
//   - cluster-autoscaler's scale-down taint counts once nodeguard marked the
//     scale-down claimed (ScaleDownClaimed);
//   - Karpenter's disrupted taint never counts by itself: the NodeClaim DELETE
//     charges the budgets, and the Node's deletion, which follows at once,
//     makes it unavailable.
func (s *Signals) AwaitsDisruptionClaim(node *corev1.Node, t corev1.Taint) bool {
	switch t.Key {
	case KarpenterDisruptedTaintKey:
		return true
	case ClusterAutoscalerTaintKey:
		if !s.ScaleDownClaims() {
			return false
		}
		_, claimed := node.Annotations[ScaleDownClaimedAnnotation]
		return !claimed
	}
	return false
}

// ScaleDownClaimed reports whether the node carries cluster-autoscaler's
// scale-down taint and nodeguard charged the scale-down to its budgets: the
// node counts unavailable until it is gone or the scale-down is cancelled.
func ScaleDownClaimed(node *corev1.Node) bool {
	_, claimed := node.Annotations[ScaleDownClaimedAnnotation]
	return claimed && ScaleDownTainted(node)
}

// ScaleDownTainted reports whether cluster-autoscaler is scaling the node
// down: it carries the ToBeDeletedByClusterAutoscaler taint.
func ScaleDownTainted(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ClusterAutoscalerTaintKey })
}

// DrainCharged reports whether someone else's drain of the node was charged
// to its budgets (DrainChargedAtAnnotation), and who drains it.
func DrainCharged(node *corev1.Node) (string, bool) {
	if _, charged := node.Annotations[DrainChargedAtAnnotation]; !charged {
		return "", false
	}
	by := node.Annotations[DrainedByAnnotation]
	if by == "" {
		by = "an unknown drainer"
	}
	return by, true
}

// DrainUnconfirmed reports a charged drain whose eviction review nodeguard has
// not yet seen carried out (see DrainConfirmedAtAnnotation).
func DrainUnconfirmed(node *corev1.Node) bool {
	_, charged := node.Annotations[DrainChargedAtAnnotation]
	_, first := node.Annotations[DrainFirstEvictionAnnotation]
	_, confirmed := node.Annotations[DrainConfirmedAtAnnotation]
	return charged && first && !confirmed
}

// TrafficCutEnded reports whether the traffic cut before a node's drain has
// ended, and when, from the TrafficCut condition: Azure confirmed the cut, or
// the drain goes on without it (waitForCut is false: --traffic-cut-failure=drain;
// or the node is in no backend pool). A node an earlier nodeguard version
// began to terminate carries TrafficCutAtAnnotation instead.
func TrafficCutEnded(node *corev1.Node, waitForCut bool) (time.Time, bool) {
	for _, c := range node.Status.Conditions {
		if c.Type != TrafficCutCondition {
			continue
		}
		if c.Status == corev1.ConditionTrue || !waitForCut || c.Reason == TrafficCutReasonNoPool {
			return c.LastTransitionTime.Time, true
		}
		return time.Time{}, false
	}
	return AnnotationTime(node, TrafficCutAtAnnotation)
}

// IsDrainingTaint reports whether a taint is nodeguard's draining taint.
func IsDrainingTaint(t corev1.Taint) bool { return t.Key == DrainingTaintKey }

// TerminatingUnderFinalizer reports whether an object is being deleted while
// nodeguard's termination finalizer holds it.
func TerminatingUnderFinalizer(obj metav1.Object) bool {
	return obj.GetDeletionTimestamp() != nil && slices.Contains(obj.GetFinalizers(), TerminationFinalizer)
}

// FormatTime formats a time for nodeguard's time annotations (RFC 3339 with
// nanoseconds, UTC).
func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ParseTime parses a time annotation; plain RFC 3339 (no fraction), as older
// nodeguard versions wrote, parses too.
func ParseTime(s string) (time.Time, error) { return time.Parse(time.RFC3339Nano, s) }

// AnnotationTime reads a time annotation of the node; false when it is
// missing or unreadable.
func AnnotationTime(node *corev1.Node, key string) (time.Time, bool) {
	v, ok := node.Annotations[key]
	if !ok {
		return time.Time{}, false
	}
	t, err := ParseTime(v)
	return t, err == nil
}

// DrainConditionAnnotation (RFC 3339 time, whole seconds) marks the KEP-5683
// DrainInProgress condition of a followed drain as nodeguard's own: nodeguard
// sets it, to the condition's lastTransitionTime, before it writes
// DrainInProgress=True on a node whose drain it follows, and removes it with
// the drain's other marks once it has set the condition False. KEP-5683 names
// no owner of a lifecycle condition (its writers coordinate outside the API),
// and the condition's reason and message are writable by anyone who may
// update nodes/status; an annotation under nodeguard.io/ only nodeguard's
// ServiceAccount may write (the admission policy of manifests/policy). A
// DrainInProgress=True condition is nodeguard's own only while this mark
// names its transition: one another writer set True afresh (a new
// transition) is that writer's, and no writer can make its condition look
// nodeguard's but by taking over nodeguard's own, True, without a transition.
const DrainConditionAnnotation = "nodeguard.io/drain-condition-at"

// OwnDrainInProgress reports whether the node's DrainInProgress condition is
// True and nodeguard wrote it (DrainConditionAnnotation).
func OwnDrainInProgress(node *corev1.Node) bool {
	c := drainInProgress(node)
	if c == nil || c.Status != corev1.ConditionTrue {
		return false
	}
	at, ok := AnnotationTime(node, DrainConditionAnnotation)
	return ok && c.LastTransitionTime.UTC().Truncate(time.Second).Equal(at.UTC().Truncate(time.Second))
}

// DrainInProgressByOther reports whether the node's DrainInProgress condition
// is True and another writer's: a drain signalled through KEP-5683 by someone
// else (with or without a cordon). nodeguard's own condition on a node it
// follows (OwnDrainInProgress) is no signal of a drain; on a node it
// terminates, the deletion is.
func DrainInProgressByOther(node *corev1.Node) bool {
	c := drainInProgress(node)
	return c != nil && c.Status == corev1.ConditionTrue && !OwnDrainInProgress(node)
}

func drainInProgress(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeDrainInProgress {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// Ready reports whether the node's Ready condition is True. A node without
// one (its kubelet never reported) is not Ready.
func Ready(node *corev1.Node) bool {
	c := ReadyCondition(node)
	return c != nil && c.Status == corev1.ConditionTrue
}

// ReadyCondition returns the node's Ready condition, nil when it has none.
func ReadyCondition(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// Cordoned reports whether the node is unschedulable (kubectl cordon, a
// drainer's first step).
func Cordoned(node *corev1.Node) bool { return node.Spec.Unschedulable }

// DrainShown reports whether the node shows a drain: it is cordoned, or
// another writer's KEP-5683 DrainInProgress condition is True. The
// DrainInProgress nodeguard itself writes on a drain it follows is no drain's
// signal (OwnDrainInProgress): nodeguard writes it only on a node whose drain
// is charged already, and one left behind on a node whose charge is gone
// must not charge the node again.
func DrainShown(node *corev1.Node) bool {
	return Cordoned(node) || DrainInProgressByOther(node)
}

// ChargedElsewhere names the disruption of the node another door already
// charged to its budgets, "" when none: it is being deleted (nodeguard
// terminates it), its scale-down by cluster-autoscaler or its NodeClaim's
// deletion was charged, or nodeguard drains it (the draining taint).
func ChargedElsewhere(node *corev1.Node) string {
	switch {
	case node.DeletionTimestamp != nil:
		return "being deleted"
	case ScaleDownClaimed(node):
		return "its scale-down by cluster-autoscaler was charged"
	}
	if _, charged := node.Annotations[NodeClaimDeleteChargedAtAnnotation]; charged {
		return "its NodeClaim's deletion was charged"
	}
	if slices.ContainsFunc(node.Spec.Taints, IsDrainingTaint) {
		return "drained by nodeguard"
	}
	return ""
}

// MarkDrainCharged writes the marks of a drain charged to the node's budgets
// onto node (the caller patches it): when, by whom, and the pod of the
// eviction review that charged it ("" for a drain found under way, which
// counts as confirmed); the renewal and confirmation of an earlier charge go.
func MarkDrainCharged(node *corev1.Node, at time.Time, by, firstEviction string) {
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[DrainChargedAtAnnotation] = FormatTime(at)
	node.Annotations[DrainedByAnnotation] = by
	if firstEviction != "" {
		node.Annotations[DrainFirstEvictionAnnotation] = firstEviction
	}
	delete(node.Annotations, DrainAskedAtAnnotation)
	delete(node.Annotations, DrainConfirmedAtAnnotation)
}
