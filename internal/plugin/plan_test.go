package plugin

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

func TestDefaultMaxConcurrentDrainsIsNodeguards(t *testing.T) {
	if DefaultMaxConcurrentDrains != finalizer.DefaultMaxConcurrentNodes {
		t.Errorf("DefaultMaxConcurrentDrains = %d, nodeguard's --max-concurrent-drains defaults to %d", DefaultMaxConcurrentDrains, finalizer.DefaultMaxConcurrentNodes)
	}
}

func TestEstimateFollowsTheChainsAndTheDeadline(t *testing.T) {
	pods := func(n int) []*corev1.Pod { return make([]*corev1.Pod, n) }
	group := func(name string, n int, allowed int32, blocked bool) drain.Group {
		return drain.Group{PDB: types.NamespacedName{Namespace: "shop", Name: name}, Pods: pods(n), Allowed: allowed, Blocked: blocked}
	}
	o := PlanOptions{PodCycle: 10 * time.Second}
	plans := []*drain.Plan{
		{Groups: []drain.Group{group("web", 5, 2, false), group("api", 2, 1, false)}}, // 3 rounds, 2 cycles; 2 rounds, 1 cycle
		{Tier: drain.TierCritical, Groups: []drain.Group{group("dns", 2, 1, false)}},  // the next tier: 1 cycle
	}
	if got, blocked := estimate(plans, nil, 0, o); got != 30*time.Second || blocked != "" {
		t.Errorf("estimate = %s %q, want 30s: the longest chain of each tier, tiers in turn", got, blocked)
	}
	// Many pods under PDBs and a quick cycle: kube-controller-manager's pace
	// binds, as in the bench's pod-fast drain (4 PDBs x 10 pods allowing 1:
	// 36 gating replacements x 4 writes - a burst of 30, at 20 a second).
	fast := []*drain.Plan{{Groups: []drain.Group{group("a", 10, 1, false), group("b", 10, 1, false), group("c", 10, 1, false), group("d", 10, 1, false)}}}
	if got, _ := estimate(fast, nil, 0, PlanOptions{PodCycle: 32 * time.Millisecond, ControllerQPS: 20}); got != 5700*time.Millisecond {
		t.Errorf("estimate of a throughput-bound drain = %s, want 5.7s", got)
	}
	plans[0].Groups = append(plans[0].Groups, group("db", 1, 0, true))
	if got, blocked := estimate(plans, nil, 0, o); got != 0 || blocked != "never by itself: PDB shop/db" {
		t.Errorf("with a blocked PDB and no deadline: %s %q", got, blocked)
	}
	if got, blocked := estimate(plans, nil, 15*time.Minute, o); got != 15*time.Minute || blocked != "until its drain deadline: PDB shop/db" {
		t.Errorf("with a blocked PDB and a 15m deadline: %s %q", got, blocked)
	}
}
