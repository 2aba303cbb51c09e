package budget

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// counted is a budget whose status says it selects expected nodes, available
// of them available and not charged.
func counted(expected, available int32, mods ...func(*ngv1alpha1.NodeDisruptionBudget)) *ngv1alpha1.NodeDisruptionBudget {
	b := ndb(mods...)
	b.Status.ExpectedNodes, b.Status.CurrentAvailable = expected, available
	n, _ := FromStatus(b, now)
	b.Status.DesiredAvailable, b.Status.DisruptionsAllowed = n.Desired, n.Allowed
	return b
}

func claimOf(nodes ...string) []change {
	var cs []change
	for _, n := range nodes {
		cs = append(cs, change{node: n})
	}
	return cs
}

// TestApplyBatch: a batch applied to one read of a budget gives each change
// the verdict it would get alone, in arrival order.
func TestApplyBatch(t *testing.T) {
	tests := []struct {
		name        string
		budget      *ngv1alpha1.NodeDisruptionBudget
		changes     []change
		wantCharged []bool
		wantDenied  []int32 // the denial code per change, 0 for none
		wantNodes   []string
		wantAllowed int32
		wantChanged bool
	}{
		{name: "claims that fit are charged, the rest denied each with 429",
			budget: counted(10, 10, maxUnavailable("3")), changes: claimOf("a", "b", "c", "d", "e"),
			wantCharged: []bool{true, true, true, false, false}, wantDenied: []int32{0, 0, 0, 429, 429},
			wantNodes: []string{"a", "b", "c"}, wantAllowed: 0, wantChanged: true},
		{name: "an already charged node is not charged again, in the read or in the batch",
			budget: counted(10, 9, maxUnavailable("3"), charged("a")), changes: claimOf("a", "b", "b"),
			wantCharged: []bool{false, true, false}, wantDenied: []int32{0, 0, 0},
			wantNodes: []string{"a", "b"}, wantAllowed: 1, wantChanged: true},
		{name: "a release frees a disruption for a later claim",
			budget:      counted(10, 9, maxUnavailable("1"), charged("a")),
			changes:     []change{{node: "b"}, {node: "a", release: true}, {node: "c"}},
			wantCharged: []bool{false, false, true}, wantDenied: []int32{429, 0, 0},
			wantNodes: []string{"c"}, wantAllowed: 0, wantChanged: true},
		{name: "releasing a node not charged changes nothing",
			budget: counted(10, 10, maxUnavailable("1")), changes: []change{{node: "a", release: true}},
			wantCharged: []bool{false}, wantDenied: []int32{0}, wantAllowed: 1},
		{name: "a budget allowing none denies every claim with 403",
			budget: counted(3, 3, maxUnavailable("0")), changes: claimOf("a", "b"),
			wantCharged: []bool{false, false}, wantDenied: []int32{403, 403}, wantAllowed: 0},
		{name: "an open window denies with 429",
			budget: counted(6, 6, maxUnavailable("3"), window("0 9 * * 1-5", 8*time.Hour, ptr.To(intstr.FromInt32(1)))), changes: claimOf("a", "b"),
			wantCharged: []bool{true, false}, wantDenied: []int32{0, 429},
			wantNodes: []string{"a"}, wantAllowed: 0, wantChanged: true},
		{name: "a budget not evaluated since its change denies with 429",
			budget: counted(3, 3, maxUnavailable("1"), func(b *ngv1alpha1.NodeDisruptionBudget) { b.Generation = 2 }), changes: claimOf("a"),
			wantCharged: []bool{false}, wantDenied: []int32{429}, wantAllowed: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.budget.DeepCopy()
			got, vs, changed := (&Claimer{}).apply(tt.budget, tt.changes, now)
			for i, v := range vs {
				var d *Denial
				code := int32(0)
				if errors.As(v.err, &d) {
					code = d.Code
				} else if v.err != nil {
					t.Errorf("change %d: unexpected error %v", i, v.err)
				}
				if v.charged != tt.wantCharged[i] || code != tt.wantDenied[i] {
					t.Errorf("change %d (%+v): charged %v, denial %d; want %v, %d", i, tt.changes[i], v.charged, code, tt.wantCharged[i], tt.wantDenied[i])
				}
			}
			if nodes := slices.Sorted(maps.Keys(got.Status.DisruptedNodes)); !slices.Equal(nodes, tt.wantNodes) {
				t.Errorf("disruptedNodes = %v, want %v", nodes, tt.wantNodes)
			}
			if got.Status.DisruptionsAllowed != tt.wantAllowed || changed != tt.wantChanged {
				t.Errorf("allowed %d, changed %v; want %d, %v", got.Status.DisruptionsAllowed, changed, tt.wantAllowed, tt.wantChanged)
			}
			if !equalStatus(tt.budget, before) {
				t.Error("apply changed the budget it read")
			}
		})
	}
}

func equalStatus(a, b *ngv1alpha1.NodeDisruptionBudget) bool {
	return a.Status.CurrentAvailable == b.Status.CurrentAvailable && a.Status.DisruptionsAllowed == b.Status.DisruptionsAllowed &&
		maps.Equal(a.Status.DisruptedNodes, b.Status.DisruptedNodes)
}

// TestFailedWriteKeepsDenials: when the write fails, the claims it carried get
// its error; denials stand, as they came from the read.
func TestFailedWriteKeepsDenials(t *testing.T) {
	denial := &Denial{Code: http.StatusTooManyRequests}
	writeErr := errors.New("write failed")
	got := failed([]verdict{{charged: true}, {err: denial}, {}}, writeErr)
	if got[0].charged || !errors.Is(got[0].err, writeErr) || got[1].err != denial || !errors.Is(got[2].err, writeErr) {
		t.Errorf("verdicts after a failed write = %+v", got)
	}
}
