package plugin

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
	"github.com/nodeguard/nodeguard/upgrade"
)

var now = time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)

// poolOf is an agent pool of n Ready nodes, aks-NAME-0, aks-NAME-1, ...
func poolOf(name string, n int) []client.Object {
	var out []client.Object
	for i := range n {
		out = append(out, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("aks-%s-%d", name, i), Labels: map[string]string{ngv1alpha1.AgentPoolLabel: name}},
			Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		})
	}
	return out
}

// budgetOf is a budget of maxUnavailable nodes of the pool, with the status
// nodeguard's status controller writes: every node available and, given
// settings, the pool's upgrade settings and their judgement.
func budgetOf(pool string, nodes int, maxUnavailable int32, settings *upgrade.Settings) *ngv1alpha1.NodeDisruptionBudget {
	ndb := &ngv1alpha1.NodeDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: pool},
		Spec: ngv1alpha1.NodeDisruptionBudgetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{ngv1alpha1.AgentPoolLabel: pool}},
			MaxUnavailable: ptrTo(intstr.FromInt32(maxUnavailable)),
		},
		Status: ngv1alpha1.NodeDisruptionBudgetStatus{DisruptionsAllowed: maxUnavailable, CurrentAvailable: int32(nodes),
			DesiredAvailable: int32(nodes) - maxUnavailable, ExpectedNodes: int32(nodes)},
	}
	if settings != nil {
		j := upgrade.Judge(*settings, nodes, int(maxUnavailable), 40*time.Second)
		ndb.Status.AgentPools = []ngv1alpha1.AgentPoolUpgrade{{Name: pool, Nodes: int32(nodes), MaxSurge: settings.MaxSurge, MaxUnavailable: settings.MaxUnavailable,
			DrainTimeoutInMinutes: int32(settings.EffectiveDrainTimeout() / time.Minute), NodeSoakDurationInMinutes: int32(settings.NodeSoak / time.Minute),
			UndrainableNodeBehavior: settings.UndrainableNodeBehavior, ConcurrentDrains: int32(j.Concurrent)}}
		status, reason := metav1.ConditionTrue, ngv1alpha1.ReasonUpgradeSettingsFit
		if !j.Fits {
			status, reason = metav1.ConditionFalse, ngv1alpha1.ReasonSurgeExceedsBudget
		}
		ndb.Status.Conditions = []metav1.Condition{{Type: ngv1alpha1.ConditionUpgradeSettingsFit, Status: status, Reason: reason, Message: j.Message}}
	}
	return ndb
}

func ptrTo[T any](v T) *T { return &v }

// fakeCluster is the plugin over a fake client holding objs, with the
// field indexes its lists use.
func fakeCluster(t *testing.T, s foresight.Settings, objs ...client.Object) *Cluster {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := ngv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&corev1.Pod{}, "spec.nodeName", func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }).
		WithIndex(&eventsv1.Event{}, "regarding.name", func(o client.Object) []string { return []string{o.(*eventsv1.Event).Regarding.Name} }).
		WithIndex(&eventsv1.Event{}, "regarding.kind", func(o client.Object) []string { return []string{o.(*eventsv1.Event).Regarding.Kind} }).
		Build()
	return &Cluster{Client: c, Settings: s, Now: func() time.Time { return now }}
}

func names(objs []client.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	return out
}

// TestUpgradePlanFlagsTheNodesThatWaitPastTheDrainTimeout: a pool of 6
// under a budget of 1 with maxSurge 3: AKS cordons 3 at a time, the budget
// admits one drain at a time, so the 2nd of a batch waits one wave (drain
// and reimage: 40s) and the 3rd two (80s), past a drain timeout of 1m but
// not of 5m. The plan takes 6 waves of 40s.
func TestUpgradePlanFlagsTheNodesThatWaitPastTheDrainTimeout(t *testing.T) {
	nodes := poolOf("user", 6)
	o := PlanOptions{Upgrade: true, ReimageTime: 40 * time.Second, PodCycle: 30 * time.Second, MaxConcurrentDrains: DefaultMaxConcurrentDrains}
	for _, tc := range []struct {
		timeout time.Duration
		flagged []string
	}{
		{time.Minute, []string{"aks-user-2", "aks-user-5"}},
		{5 * time.Minute, nil},
	} {
		t.Run(tc.timeout.String(), func(t *testing.T) {
			ndb := budgetOf("user", 6, 1, &upgrade.Settings{Pool: "user", MaxSurge: "3", DrainTimeout: tc.timeout})
			c := fakeCluster(t, foresight.Settings{DrainTimeout: time.Hour}, append(nodes, ndb)...)
			r, err := c.Plan(context.Background(), names(nodes), o, "test")
			if err != nil {
				t.Fatal(err)
			}
			if r.Waves != 6 || r.Estimate != 6*40*time.Second {
				t.Errorf("plan = %d waves, %s; want 6 waves of 40s (no pod to drain, 40s reimage)", r.Waves, r.Estimate)
			}
			if len(r.Pools) != 1 || r.Pools[0].ConcurrentDrains != 3 || r.Pools[0].SettingsFrom != `NodeDisruptionBudget "user" status.agentPools` {
				t.Fatalf("pools = %+v; want user, 3 at once, from the budget's status", r.Pools)
			}
			wantWaits := map[string]time.Duration{"aks-user-0": 0, "aks-user-1": 40 * time.Second, "aks-user-2": 80 * time.Second,
				"aks-user-3": 0, "aks-user-4": 40 * time.Second, "aks-user-5": 80 * time.Second}
			var flagged []string
			for _, n := range r.Nodes {
				if n.Wait != wantWaits[n.Node] || n.Pool != "user" {
					t.Errorf("%s waits %s in pool %q, want %s in user", n.Node, n.Wait, n.Pool, wantWaits[n.Node])
				}
				if n.ExceedsDrainTimeout {
					flagged = append(flagged, n.Node)
				}
			}
			if fmt.Sprint(flagged) != fmt.Sprint(tc.flagged) {
				t.Errorf("flagged %v, want %v", flagged, tc.flagged)
			}
			var out strings.Builder
			if err := r.Print(&out); err != nil {
				t.Fatal(err)
			}
			if tc.flagged != nil {
				for _, want := range []string{
					"aks-user-2 waits about 1m20s for the budget, past agent pool user's drainTimeoutInMinutes 1: AKS fails the upgrade (Schedule)",
					"Agent pool user: 6 of its 6 node(s), 3 drained at once (maxSurge 3, maxUnavailable 0 (default)), drainTimeoutInMinutes 1",
					`NodeDisruptionBudget "user" UpgradeSettingsFit=False (SurgeExceedsBudget): agent pool user: an upgrade drains 3 node(s) at once`,
				} {
					if !strings.Contains(out.String(), want) {
						t.Errorf("the plan printed no %q:\n%s", want, out.String())
					}
				}
			}
		})
	}
}

// TestUpgradePlanFallsBackToAKSDefaults: without the pool's settings in a
// budget's status (nodeguard without --aks-managed-cluster), the plan says
// so and uses AKS's defaults: 10% of 6 nodes is 1 at a time, so no drain
// waits for the budget. --max-surge still overrides the concurrent drains.
// The drain deadline is the budget's when shorter than --drain-timeout.
func TestUpgradePlanFallsBackToAKSDefaults(t *testing.T) {
	nodes := poolOf("user", 6)
	ndb := budgetOf("user", 6, 1, nil)
	ndb.Spec.DrainTimeout = &metav1.Duration{Duration: 10 * time.Minute}
	c := fakeCluster(t, foresight.Settings{DrainTimeout: time.Hour, BlockedPDBPolicy: drain.BlockedPDBWait}, append(nodes, ndb)...)
	o := PlanOptions{Upgrade: true, ReimageTime: 40 * time.Second, PodCycle: 30 * time.Second, MaxConcurrentDrains: DefaultMaxConcurrentDrains}
	r, err := c.Plan(context.Background(), names(nodes), o, "test")
	if err != nil {
		t.Fatal(err)
	}
	p := r.Pools[0]
	if p.ConcurrentDrains != 1 || p.DrainTimeout != upgrade.DefaultDrainTimeout || !strings.HasPrefix(p.SettingsFrom, "AKS's defaults") {
		t.Errorf("pool = %+v; want AKS's defaults: 1 at a time, 30m, and saying so", p)
	}
	for _, n := range r.Nodes {
		if n.Wait != 0 || n.ExceedsDrainTimeout {
			t.Errorf("%s waits %s (flagged %v); one at a time, no drain waits", n.Node, n.Wait, n.ExceedsDrainTimeout)
		}
		if n.Deadline.Timeout != 10*time.Minute || n.Deadline.From != `NodeDisruptionBudget "user" drainTimeout` {
			t.Errorf("%s's drain deadline = %+v, want the budget's 10m", n.Node, n.Deadline)
		}
	}

	o.MaxSurge = 2
	r, err = c.Plan(context.Background(), names(nodes), o, "test")
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Pools[0]; p.ConcurrentDrains != 2 || !strings.HasSuffix(p.SettingsFrom, "concurrent drains from --max-surge") {
		t.Errorf("pool with --max-surge 2 = %+v; want 2 at once, from --max-surge", p)
	}
	if r.Waves != 6 || r.Nodes[1].Wait != 40*time.Second {
		t.Errorf("plan with --max-surge 2 = %d waves, %s waits %s; want 6 waves, the 2nd of a batch waiting one", r.Waves, r.Nodes[1].Node, r.Nodes[1].Wait)
	}
}

// TestUpgradePlanNeedsAgentPools: a node in no agent pool is refused, not
// planned with settings it has none of.
func TestUpgradePlanNeedsAgentPools(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kind-worker"}}
	c := fakeCluster(t, foresight.Settings{}, node)
	if _, err := c.Plan(context.Background(), []string{"kind-worker"}, PlanOptions{Upgrade: true}, "test"); err == nil ||
		!strings.Contains(err.Error(), "no kubernetes.azure.com/agentpool label") {
		t.Errorf("plan --upgrade of a node in no agent pool = %v, want an error naming the label", err)
	}
}

// TestWhyShowsTheDrainDeadline: why says the node's drain deadline and what
// sets it.
func TestWhyShowsTheDrainDeadline(t *testing.T) {
	nodes := poolOf("user", 2)
	ndb := budgetOf("user", 2, 1, nil)
	ndb.Spec.DrainTimeout = &metav1.Duration{Duration: 10 * time.Minute}
	c := fakeCluster(t, foresight.Settings{DrainTimeout: time.Hour}, append(nodes, ndb)...)
	r, err := c.Why(context.Background(), "aks-user-0", "test")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := r.Print(&out, now); err != nil {
		t.Fatal(err)
	}
	if want := `Drain deadline: +10m0s after the deletion \(NodeDisruptionBudget "user" drainTimeout\)`; !regexp.MustCompile(want).MatchString(out.String()) {
		t.Errorf("why printed nothing matching %q:\n%s", want, out.String())
	}
	if r.Deadline.Timeout != 10*time.Minute {
		t.Errorf("why's drain deadline = %+v, want the budget's 10m", r.Deadline)
	}
}

// TestUpgradePlanStopsAtABatchThatNeverCompletes: a budget that allows no
// disruption admits none of the first batch, which AKS gives up on; the
// next batch is never cordoned.
func TestUpgradePlanStopsAtABatchThatNeverCompletes(t *testing.T) {
	nodes := poolOf("user", 4)
	ndb := budgetOf("user", 4, 0, &upgrade.Settings{Pool: "user", MaxSurge: "2", UndrainableNodeBehavior: upgrade.UndrainableCordon})
	c := fakeCluster(t, foresight.Settings{}, append(nodes, ndb)...)
	r, err := c.Plan(context.Background(), names(nodes), PlanOptions{Upgrade: true, ReimageTime: time.Minute}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if r.Waves != 0 || r.Estimate != 0 {
		t.Errorf("plan = %d waves, %s; want none", r.Waves, r.Estimate)
	}
	for _, n := range r.Nodes {
		first := n.Node == "aks-user-0" || n.Node == "aks-user-1"
		if n.Wave != 0 || n.ExceedsDrainTimeout != first {
			t.Errorf("%s = wave %d, flagged %v; want never, flagged only in the first batch", n.Node, n.Wave, n.ExceedsDrainTimeout)
		}
		if !first && n.WaitsFor != "AKS's batch of aks-user-0, which never completes" {
			t.Errorf("%s waits for %q, want the first batch", n.Node, n.WaitsFor)
		}
	}
	if want := "aks-user-0 is never admitted (it waits for NodeDisruptionBudget user (allowed 0, unavailable 0 of max 0)), past agent pool user's drainTimeoutInMinutes 30: AKS quarantines it (Cordon)"; r.Nodes[0].ExceedsMessage != want {
		t.Errorf("aks-user-0: %q, want %q", r.Nodes[0].ExceedsMessage, want)
	}
}
