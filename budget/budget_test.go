package budget

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
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
			n, err := Evaluate(tt.budget, tt.nodes, nil, now)
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
	// A process whose clock is in another zone (TZ in the image) recomputes
	// at the same UTC hours.
	eveningEast := evening.In(time.FixedZone("UTC+2", 2*60*60))
	if got, want := NextWindowChange(b.Spec.Windows, eveningEast), time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("next change from a UTC+2 clock = %v, want the window opening at %v", got.UTC(), want)
	}
}

func TestComputeStatusPrunesClaims(t *testing.T) {
	r := &StatusReconciler{ClaimTimeout: 2 * time.Minute, UnconfirmedTimeout: 15 * time.Second}
	b := ndb(maxUnavailable("3"))
	b.Generation = 3
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	b.Status.DisruptedNodes = map[string]metav1.Time{
		"waiting":  ago(5 * time.Second),  // available, within both timeouts: kept
		"expired":  ago(3 * time.Minute),  // the delete never happened (fresh read): dropped
		"deleting": ago(3 * time.Minute),  // deleting: kept until it is gone
		"gone":     ago(time.Minute),      // not cached, and the API server has no such node: dropped
		"lagging":  ago(time.Minute),      // not cached yet, but the API server has it: kept
		"forged":   ago(20 * time.Second), // no disruption within 15s, nor in a fresh read: given back
		"caught":   ago(20 * time.Second), // cached Ready, but deleting in a fresh read: kept
		"unread":   ago(20 * time.Second), // past 15s, not read fresh in this pass: kept, looked at again soon
		"scaled":   ago(20 * time.Second), // scale-down claimed: under way, kept
	}
	scaled := func(n *corev1.Node) {
		n.Annotations = map[string]string{ngv1alpha1.ScaleDownClaimedAnnotation: ngv1alpha1.FormatTime(now)}
		n.Spec.Taints = []corev1.Taint{{Key: ngv1alpha1.ClusterAutoscalerTaintKey}}
	}
	selected := []*corev1.Node{node("waiting"), node("expired"), node("deleting", deleting), node("forged"),
		node("caught"), node("unread"), node("scaled", scaled), node("other")}
	claims := r.newClaimReview(b, selected)
	claims.fresh = map[string]*corev1.Node{"expired": node("expired"), "gone": nil, "lagging": node("lagging"),
		"forged": node("forged"), "caught": node("caught", deleting)}
	status, requeueAt := r.computeStatus(b, selected, claims, now)

	if got, want := slices.Sorted(maps.Keys(status.DisruptedNodes)), []string{"caught", "deleting", "lagging", "scaled", "unread", "waiting"}; !slices.Equal(got, want) {
		t.Errorf("disruptedNodes = %v, want %v", got, want)
	}
	if len(claims.unconfirmed) != 1 || claims.unconfirmed[0].Node != "forged" {
		t.Errorf("given back unconfirmed: %+v, want forged only", claims.unconfirmed)
	}
	if want := now.Add(confirmRetry); !requeueAt.Equal(want) {
		t.Errorf("requeue at %v, want %v (the claims the cache and the API server disagree on)", requeueAt, want)
	}
	// 9 nodes, max 3 unavailable: deleting and scaled are unavailable; waiting,
	// caught, unread and lagging (not cached, counted all the same) are
	// charged; expired, forged and other are available.
	if status.ExpectedNodes != 9 || status.CurrentAvailable != 3 || status.DesiredAvailable != 6 || status.DisruptionsAllowed != 0 {
		t.Errorf("status numbers = %+v", status)
	}
	if status.ObservedGeneration != 3 {
		t.Errorf("observedGeneration = %d, want 3", status.ObservedGeneration)
	}
	if len(status.Conditions) != 1 || status.Conditions[0].Status != metav1.ConditionFalse ||
		status.Conditions[0].Reason != ngv1alpha1.ReasonInsufficientNodes || status.Conditions[0].Message != "allowed 0, unavailable 6 of max 3" {
		t.Errorf("conditions = %+v", status.Conditions)
	}
}

func TestClaimReviewAsksTheAPIServerOnlyWhenTheCacheWouldDrop(t *testing.T) {
	r := &StatusReconciler{ClaimTimeout: 2 * time.Minute, UnconfirmedTimeout: 15 * time.Second}
	b := ndb(maxUnavailable("1"))
	claims := r.newClaimReview(b, []*corev1.Node{node("young"), node("old"), node("deleting", deleting)})
	tests := []struct {
		node    string
		age     time.Duration
		wantAsk bool
	}{
		{"young", 5 * time.Second, false},
		{"old", 20 * time.Second, true},
		{"deleting", 5 * time.Minute, false},
		{"uncached", time.Second, true},
	}
	for _, tt := range tests {
		if _, next, ask := claims.judge(tt.node, now.Add(-tt.age), now); ask != tt.wantAsk {
			t.Errorf("%s claimed %s ago: ask %v (next %v), want %v", tt.node, tt.age, ask, next, tt.wantAsk)
		}
	}
}

// TestCheckAnswersWhatTheClientCanDo: a claim the budget's status allows
// passes; a refusal that retrying can cure is a 429 (a status not yet
// evaluated, one that counts none of the budget's nodes, a budget spent),
// one that only a change of the budget cures is a 403.
func TestCheckAnswersWhatTheClientCanDo(t *testing.T) {
	status := func(expected, available int32) func(*ngv1alpha1.NodeDisruptionBudget) {
		return func(b *ngv1alpha1.NodeDisruptionBudget) {
			b.Status.ExpectedNodes, b.Status.CurrentAvailable = expected, available
		}
	}
	unevaluated := func(b *ngv1alpha1.NodeDisruptionBudget) { b.Generation = 2; b.Status.ObservedGeneration = 1 }
	tests := []struct {
		name     string
		budget   *ngv1alpha1.NodeDisruptionBudget
		wantCode int32 // 0: allowed
		wantSays string
	}{
		{"allowed", ndb(maxUnavailable("1"), status(3, 3)), 0, ""},
		{"status not evaluated since the change", ndb(maxUnavailable("1"), status(3, 3), unevaluated), http.StatusTooManyRequests, "has not been evaluated since its last change"},
		{"status written before its nodes were seen", ndb(maxUnavailable("1"), status(0, 0)), http.StatusTooManyRequests, "counts none of its nodes yet"},
		{"spent", ndb(maxUnavailable("1"), status(3, 2)), http.StatusTooManyRequests, "allows no more disruptions now"},
		{"allows none by its spec", ndb(maxUnavailable("0"), status(3, 3)), http.StatusForbidden, "allows no disruption of its 3 nodes"},
		{"invalid", ndb(maxUnavailable("1"), status(3, 3), func(b *ngv1alpha1.NodeDisruptionBudget) {
			b.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pool", Operator: "Bogus"}}}
		}), http.StatusForbidden, "is invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := (&Claimer{}).check(tt.budget, now)
			var d *Denial
			switch {
			case tt.wantCode == 0 && err != nil:
				t.Errorf("refused: %v", err)
			case tt.wantCode != 0 && !errors.As(err, &d):
				t.Errorf("error %v, want a denial %d", err, tt.wantCode)
			case tt.wantCode != 0 && (d.Code != tt.wantCode || !strings.Contains(d.Message, tt.wantSays)):
				t.Errorf("denial %d %q, want %d saying %q", d.Code, d.Message, tt.wantCode, tt.wantSays)
			}
		})
	}
}

// TestWindowsCondition: a budget whose windows all fire says so; one with a
// window that never fires (February 31st) names it, and none is set without
// windows.
func TestWindowsCondition(t *testing.T) {
	if c := windowsCondition(ndb(), now); c != nil {
		t.Errorf("condition without windows = %+v, want none", c)
	}
	c := windowsCondition(ndb(window("0 8 * * 1-5", time.Hour, nil)), now)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ngv1alpha1.ReasonWindowsFire {
		t.Errorf("condition with a weekday window = %+v, want True", c)
	}
	c = windowsCondition(ndb(window("0 8 * * 1-5", time.Hour, nil), window("0 0 31 2 *", time.Hour, nil)), now)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ngv1alpha1.ReasonWindowNeverOpens ||
		!strings.Contains(c.Message, `windows[1] ("0 0 31 2 *")`) || strings.Contains(c.Message, "windows[0]") {
		t.Errorf("condition with a February 31st window = %+v, want False naming windows[1]", c)
	}
}
