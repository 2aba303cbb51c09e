package drain

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// TestTimeoutIsTheShortestOfTheNodesAndItsBudgets: the node's own timeout
// (annotation, else --drain-timeout) and the drainTimeout of each budget
// selecting it; 0 sets no deadline, and a budget that does not select the
// node has no say.
func TestTimeoutIsTheShortestOfTheNodesAndItsBudgets(t *testing.T) {
	ndb := func(name, pool string, timeout time.Duration) ngv1alpha1.NodeDisruptionBudget {
		b := ngv1alpha1.NodeDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: ngv1alpha1.NodeDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}}}}
		if timeout >= 0 {
			b.Spec.DrainTimeout = &metav1.Duration{Duration: timeout}
		}
		return b
	}
	node := func(annotation string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"pool": "user"}}}
		if annotation != "" {
			n.Annotations = map[string]string{ngv1alpha1.DrainTimeoutAnnotation: annotation}
		}
		return n
	}
	const annotation = "annotation " + ngv1alpha1.DrainTimeoutAnnotation
	for _, tc := range []struct {
		name       string
		annotation string
		global     time.Duration
		budgets    []ngv1alpha1.NodeDisruptionBudget
		want       time.Duration
		source     string
		bad        bool
	}{
		{name: "annotation longer than the budget's", annotation: "1h", global: 2 * time.Hour,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 10*time.Minute)},
			want:    10 * time.Minute, source: `NodeDisruptionBudget "web" drainTimeout`},
		{name: "annotation shorter than the budget's", annotation: "5m",
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 10*time.Minute)},
			want:    5 * time.Minute, source: annotation},
		{name: "budget shorter than --drain-timeout", global: time.Hour,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute), ndb("db", "user", 15*time.Minute), ndb("other", "system", time.Minute)},
			want:    15 * time.Minute, source: `NodeDisruptionBudget "db" drainTimeout`},
		{name: "budget deadline with no --drain-timeout", global: 0,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute)},
			want:    20 * time.Minute, source: `NodeDisruptionBudget "web" drainTimeout`},
		{name: "no budget deadline", global: time.Hour,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", -1), ndb("zero", "user", 0)},
			want:    time.Hour, source: "--drain-timeout"},
		{name: "annotation 0 lifts only the node's own", annotation: "0s", global: time.Hour,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute)},
			want:    20 * time.Minute, source: `NodeDisruptionBudget "web" drainTimeout`},
		{name: "no deadline at all", annotation: "0s", global: time.Hour, want: 0, source: annotation},
		{name: "invalid annotation: --drain-timeout", annotation: "soon", global: time.Hour,
			want: time.Hour, source: "--drain-timeout", bad: true},
		{name: "invalid annotation, budget shorter", annotation: "-5m", global: time.Hour,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute)},
			want:    20 * time.Minute, source: `NodeDisruptionBudget "web" drainTimeout`, bad: true},
		{name: "a tie goes to the node's own", global: 20 * time.Minute,
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute)},
			want:    20 * time.Minute, source: "--drain-timeout"},
		{name: "a tie of budgets goes to the first by name",
			budgets: []ngv1alpha1.NodeDisruptionBudget{ndb("web", "user", 20*time.Minute), ndb("api", "user", 20*time.Minute)},
			want:    20 * time.Minute, source: `NodeDisruptionBudget "api" drainTimeout`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, source, err := Timeout(node(tc.annotation), tc.global, tc.budgets)
			if got != tc.want || source != tc.source || (err != nil) != tc.bad {
				t.Errorf("Timeout = %s, %q, %v; want %s, %q, error %t", got, source, err, tc.want, tc.source, tc.bad)
			}
		})
	}
}
