package budget

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

var now = time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC) // a Monday

func node(name string, mods ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	for _, m := range mods {
		m(n)
	}
	return n
}

func notReady(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }
func deleting(n *corev1.Node) { n.DeletionTimestamp = ptr.To(metav1.NewTime(now)) }
func tainted(key, value string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value}) }
}

func nodes(ready int, others ...*corev1.Node) []*corev1.Node {
	var out []*corev1.Node
	for i := range ready {
		out = append(out, node("ready-"+string(rune('a'+i))))
	}
	return append(out, others...)
}

func ndb(mods ...func(*ngv1alpha1.NodeDisruptionBudget)) *ngv1alpha1.NodeDisruptionBudget {
	b := &ngv1alpha1.NodeDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: &metav1.LabelSelector{}}}
	for _, m := range mods {
		m(b)
	}
	return b
}

func maxUnavailable(v string) func(*ngv1alpha1.NodeDisruptionBudget) {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.MaxUnavailable = ptr.To(intstr.Parse(v)) }
}
func minAvailable(v string) func(*ngv1alpha1.NodeDisruptionBudget) {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.MinAvailable = ptr.To(intstr.Parse(v)) }
}
func window(schedule string, d time.Duration, max *intstr.IntOrString) func(*ngv1alpha1.NodeDisruptionBudget) {
	return func(b *ngv1alpha1.NodeDisruptionBudget) {
		b.Spec.Windows = append(b.Spec.Windows, ngv1alpha1.DisruptionWindow{Schedule: schedule, Duration: metav1.Duration{Duration: d}, MaxUnavailable: max})
	}
}
func charged(names ...string) func(*ngv1alpha1.NodeDisruptionBudget) {
	return func(b *ngv1alpha1.NodeDisruptionBudget) {
		b.Status.DisruptedNodes = map[string]metav1.Time{}
		for _, n := range names {
			b.Status.DisruptedNodes[n] = metav1.NewTime(now)
		}
	}
}

func annotated(key string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Annotations = map[string]string{key: ngv1alpha1.FormatTime(now)}
	}
}

func TestEvaluate(t *testing.T) {
	tests := []struct {
		name                                                  string
		budget                                                *ngv1alpha1.NodeDisruptionBudget
		nodes                                                 []*corev1.Node
		wantExpected, wantAvailable, wantDesired, wantAllowed int32
		wantWindow                                            bool
	}{
		{name: "maxUnavailable 1 of 3 ready", budget: ndb(maxUnavailable("1")), nodes: nodes(3),
			wantExpected: 3, wantAvailable: 3, wantDesired: 2, wantAllowed: 1},
		{name: "not ready node uses the budget", budget: ndb(maxUnavailable("1")), nodes: nodes(2, node("x", notReady)),
			wantExpected: 3, wantAvailable: 2, wantDesired: 2, wantAllowed: 0},
		{name: "deleting node uses the budget", budget: ndb(maxUnavailable("2")), nodes: nodes(3, node("x", deleting)),
			wantExpected: 4, wantAvailable: 3, wantDesired: 2, wantAllowed: 1},
		{name: "every signal taint and the draining taint count", budget: ndb(maxUnavailable("100%")), nodes: nodes(1,
			node("oos", tainted(ngv1alpha1.OutOfServiceTaintKey, "nodeshutdown")),
			node("shutdown", tainted(ngv1alpha1.CloudShutdownTaintKey, "")),
			node("spot", tainted(ngv1alpha1.SpotEvictionTaintKey, ngv1alpha1.SpotEvictionTaintValue)),
			node("draining", tainted(ngv1alpha1.DrainingTaintKey, "true"))),
			wantExpected: 5, wantAvailable: 1, wantDesired: 0, wantAllowed: 1},
		{name: "autoscalers' taints count only once charged", budget: ndb(maxUnavailable("1")), nodes: nodes(1,
			node("ca-picked", tainted(ngv1alpha1.ClusterAutoscalerTaintKey, "1795000000")),
			node("ca-claimed", tainted(ngv1alpha1.ClusterAutoscalerTaintKey, "1795000000"), annotated(ngv1alpha1.ScaleDownClaimedAnnotation)),
			node("karpenter", tainted(ngv1alpha1.KarpenterDisruptedTaintKey, ""))),
			wantExpected: 4, wantAvailable: 3, wantDesired: 3, wantAllowed: 0},
		{name: "a claim mark without the taint (cancelled scale-down) does not count", budget: ndb(maxUnavailable("1")), nodes: nodes(1,
			node("cancelled", annotated(ngv1alpha1.ScaleDownClaimedAnnotation))),
			wantExpected: 2, wantAvailable: 2, wantDesired: 1, wantAllowed: 1},
		{name: "other taints and cordon do not count", budget: ndb(maxUnavailable("1")), nodes: nodes(1,
			node("other", tainted(ngv1alpha1.SpotEvictionTaintKey, "something-else"), func(n *corev1.Node) { n.Spec.Unschedulable = true })),
			wantExpected: 2, wantAvailable: 2, wantDesired: 1, wantAllowed: 1},
		{name: "charged node is not available", budget: ndb(maxUnavailable("2"), charged("ready-a")), nodes: nodes(4),
			wantExpected: 4, wantAvailable: 3, wantDesired: 2, wantAllowed: 1},
		{name: "minAvailable percentage rounds up", budget: ndb(minAvailable("50%")), nodes: nodes(5),
			wantExpected: 5, wantAvailable: 5, wantDesired: 3, wantAllowed: 2},
		{name: "maxUnavailable percentage rounds up", budget: ndb(maxUnavailable("10%")), nodes: nodes(11),
			wantExpected: 11, wantAvailable: 11, wantDesired: 9, wantAllowed: 2},
		{name: "minAvailable above the node count allows nothing", budget: ndb(minAvailable("5")), nodes: nodes(3),
			wantExpected: 3, wantAvailable: 3, wantDesired: 5, wantAllowed: 0},
		{name: "no nodes", budget: ndb(maxUnavailable("1")), nodes: nil,
			wantExpected: 0, wantAvailable: 0, wantDesired: 0, wantAllowed: 0},
		{name: "open window allows none by default", budget: ndb(maxUnavailable("3"), window("0 9 * * 1-5", 8*time.Hour, nil)), nodes: nodes(6),
			wantExpected: 6, wantAvailable: 6, wantDesired: 6, wantAllowed: 0, wantWindow: true},
		{name: "open window with its own maxUnavailable", budget: ndb(maxUnavailable("3"), window("0 9 * * 1-5", 8*time.Hour, ptr.To(intstr.FromInt32(1)))), nodes: nodes(6),
			wantExpected: 6, wantAvailable: 6, wantDesired: 5, wantAllowed: 1, wantWindow: true},
		{name: "closed window changes nothing", budget: ndb(maxUnavailable("3"), window("0 18 * * 1-5", 8*time.Hour, nil)), nodes: nodes(6),
			wantExpected: 6, wantAvailable: 6, wantDesired: 3, wantAllowed: 3},
		{name: "window looser than the budget changes nothing", budget: ndb(maxUnavailable("1"), window("0 9 * * 1-5", 8*time.Hour, ptr.To(intstr.FromInt32(4)))), nodes: nodes(6),
			wantExpected: 6, wantAvailable: 6, wantDesired: 5, wantAllowed: 1},
		{name: "window that opened yesterday and lasts two days", budget: ndb(maxUnavailable("2"), window("0 10 * * *", 48*time.Hour, nil)), nodes: nodes(3),
			wantExpected: 3, wantAvailable: 3, wantDesired: 3, wantAllowed: 0, wantWindow: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := Evaluate(tt.budget, tt.nodes, now)
			if err != nil {
				t.Fatal(err)
			}
			if n.Expected != tt.wantExpected || n.Available != tt.wantAvailable || n.Desired != tt.wantDesired || n.Allowed != tt.wantAllowed {
				t.Errorf("got expected %d available %d desired %d allowed %d, want %d %d %d %d",
					n.Expected, n.Available, n.Desired, n.Allowed, tt.wantExpected, tt.wantAvailable, tt.wantDesired, tt.wantAllowed)
			}
			if (n.Window != nil) != tt.wantWindow {
				t.Errorf("window = %+v, want open: %v", n.Window, tt.wantWindow)
			}
		})
	}
}

func TestWindowEndsAndNextChange(t *testing.T) {
	b := ndb(maxUnavailable("1"), window("0 9 * * 1-5", 8*time.Hour, nil))
	b.Status.ExpectedNodes, b.Status.CurrentAvailable = 3, 3
	n, err := FromStatus(b, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC); n.Window == nil || !n.Window.Ends.Equal(want) {
		t.Fatalf("window = %+v, want it open until %v", n.Window, want)
	}
	if got, want := NextWindowChange(b.Spec.Windows, now), time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("next change = %v, want the window closing at %v", got, want)
	}
	evening := time.Date(2026, 11, 23, 18, 0, 0, 0, time.UTC)
	if got, want := NextWindowChange(b.Spec.Windows, evening), time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("next change = %v, want the window opening at %v", got, want)
	}
}

func TestComputeStatusPrunesClaims(t *testing.T) {
	r := &StatusReconciler{ClaimTimeout: 2 * time.Minute}
	b := ndb(maxUnavailable("2"))
	b.Generation = 3
	b.Status.DisruptedNodes = map[string]metav1.Time{
		"waiting":  metav1.NewTime(now.Add(-time.Minute)),     // available, within the timeout: kept
		"expired":  metav1.NewTime(now.Add(-3 * time.Minute)), // the delete never happened: dropped
		"deleting": metav1.NewTime(now.Add(-time.Minute)),     // seen unavailable: dropped
		"gone":     metav1.NewTime(now.Add(-time.Minute)),     // no longer exists: dropped
	}
	selected := []*corev1.Node{node("waiting"), node("expired"), node("deleting", deleting), node("other")}
	status, requeueAt := r.computeStatus(b, selected, now)

	if _, kept := status.DisruptedNodes["waiting"]; len(status.DisruptedNodes) != 1 || !kept {
		t.Errorf("disruptedNodes = %v, want only the waiting claim", status.DisruptedNodes)
	}
	if !requeueAt.Equal(now.Add(time.Minute)) {
		t.Errorf("requeue at %v, want when the waiting claim expires (%v)", requeueAt, now.Add(time.Minute))
	}
	// 4 nodes, max 2 unavailable: "deleting" is unavailable and "waiting" charged.
	if status.ExpectedNodes != 4 || status.CurrentAvailable != 2 || status.DesiredAvailable != 2 || status.DisruptionsAllowed != 0 {
		t.Errorf("status numbers = %+v", status)
	}
	if status.ObservedGeneration != 3 {
		t.Errorf("observedGeneration = %d, want 3", status.ObservedGeneration)
	}
	if len(status.Conditions) != 1 || status.Conditions[0].Status != metav1.ConditionFalse ||
		status.Conditions[0].Reason != ngv1alpha1.ReasonInsufficientNodes || status.Conditions[0].Message != "allowed 0, unavailable 2 of max 2" {
		t.Errorf("conditions = %+v", status.Conditions)
	}
}
