package finalizer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

func testPods(prefix string, n int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: fmt.Sprintf("%s-%d", prefix, i)}})
	}
	return pods
}

func TestDrainMessage(t *testing.T) {
	started := time.Date(2026, 11, 26, 15, 40, 0, 0, time.UTC)
	web := types.NamespacedName{Namespace: "demo", Name: "web"}
	pdbGroup := drain.Group{PDB: web, Pods: testPods("web", 5), Blocked: true, Allowed: 0, Healthy: 5, Desired: 5, Expected: 5}
	tests := []struct {
		name     string
		plan     drain.Plan
		out      drain.Outcome
		deadline time.Time
		now      time.Time
		want     string
	}{
		{
			name: "a PDB that refused, terminating pods and later tiers",
			plan: drain.Plan{Groups: []drain.Group{pdbGroup}, Terminating: testPods("going", 1), Later: testPods("agent", 2)},
			out:  drain.Outcome{Blocked: []types.NamespacedName{web}},
			now:  started.Add(time.Minute),
			want: `Drain not completed yet (started at 2026-11-26T15:40:00Z):
* Pod demo/going-0: deletionTimestamp set, but still not removed from the Node
* Pods demo/web-0, demo/web-1, demo/web-2, ... (2 more): under PDB demo/web (allows 0 disruptions: currentHealthy 5, desiredHealthy 5, expectedPods 5); eviction refused, waiting for its status to change
After above Pods have been removed from the Node, the following Pods will be evicted: demo/agent-0, demo/agent-1`,
		},
		{
			name: "past 15 minutes the likely delay is named",
			plan: drain.Plan{Groups: []drain.Group{pdbGroup}, DoNotEvict: testPods("keep", 1)},
			now:  started.Add(DrainStaleAfter + time.Second),
			want: `Drain not completed yet (started at 2026-11-26T15:40:00Z):
* Pods demo/web-0, demo/web-1, demo/web-2, ... (2 more): under PDB demo/web (allows 0 disruptions: currentHealthy 5, desiredHealthy 5, expectedPods 5); waiting for its status to change
* Pod demo/keep-0: annotated nodeguard.io/do-not-evict=true, waiting for them to go on their own
Drain in progress for more than 15m0s, delay likely due to PodDisruptionBudgets, Pods annotated nodeguard.io/do-not-evict`,
		},
		{
			name:     "the drain deadline comes before the likely delay",
			plan:     drain.Plan{Groups: []drain.Group{pdbGroup}},
			deadline: started.Add(DrainStaleAfter + time.Second + 41*time.Minute),
			now:      started.Add(DrainStaleAfter + time.Second),
			want: `Drain not completed yet (started at 2026-11-26T15:40:00Z):
* Pods demo/web-0, demo/web-1, demo/web-2, ... (2 more): under PDB demo/web (allows 0 disruptions: currentHealthy 5, desiredHealthy 5, expectedPods 5); waiting for its status to change
Drain deadline in 41m0s (--drain-timeout): then the remaining Pods are deleted
Drain in progress for more than 15m0s, delay likely due to PodDisruptionBudgets`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := drainMessage(&tt.plan, tt.out, started, tt.deadline, tt.now); got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestDrainMessageKeepsFiveGroups: past five causes, the rest are counted.
func TestDrainMessageKeepsFiveGroups(t *testing.T) {
	var plan drain.Plan
	for i := range 7 {
		plan.Groups = append(plan.Groups, drain.Group{PDB: types.NamespacedName{Namespace: "demo", Name: fmt.Sprintf("pdb-%d", i)}, Pods: testPods(fmt.Sprintf("app%d", i), 2)})
	}
	got := drainMessage(&plan, drain.Outcome{}, time.Now(), time.Time{}, time.Now())
	lines := strings.Split(got, "\n")
	if len(lines) != 7 || lines[6] != "* 4 Pods with other issues" {
		t.Errorf("want a first line, 5 groups and a count of the other 4 pods, got\n%s", got)
	}
}
