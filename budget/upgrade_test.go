package budget

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/upgrade"
)

type pools struct {
	settings map[string]upgrade.Settings
	err      error
}

func (p pools) AgentPools() (map[string]upgrade.Settings, error) { return p.settings, p.err }

func inPool(pool string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Labels = map[string]string{ngv1alpha1.AgentPoolLabel: pool} }
}

// poolNodes is 6 nodes of agent pool user, 2 of system and one of no pool.
func poolNodes() []*corev1.Node {
	var out []*corev1.Node
	for _, name := range []string{"u0", "u1", "u2", "u3", "u4", "u5"} {
		out = append(out, node(name, inPool("user")))
	}
	return append(out, node("s0", inPool("system")), node("s1", inPool("system")), node("loose"))
}

func TestUpgradeStatusJudgesEachAgentPool(t *testing.T) {
	src := pools{settings: map[string]upgrade.Settings{
		"user":   {Pool: "user", MaxSurge: "3", DrainTimeout: time.Minute, UndrainableNodeBehavior: upgrade.UndrainableCordon},
		"system": {Pool: "system", MaxSurge: "1"},
	}}
	b := ndb(maxUnavailable("1"))
	var status ngv1alpha1.NodeDisruptionBudgetStatus
	setUpgradeStatus(&status, b, poolNodes(), src, 40*time.Second)

	if len(status.AgentPools) != 2 || status.AgentPools[0].Name != "system" || status.AgentPools[1].Name != "user" {
		t.Fatalf("agentPools = %+v, want system and user", status.AgentPools)
	}
	user := status.AgentPools[1]
	if user.Nodes != 6 || user.ConcurrentDrains != 3 || user.DrainTimeoutInMinutes != 1 || user.UndrainableNodeBehavior != "Cordon" || user.LongestWait.Duration != 80*time.Second {
		t.Errorf("user pool = %+v, want 6 nodes, 3 at once, 1 minute, Cordon, an 80s wait", user)
	}
	c := meta.FindStatusCondition(status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ngv1alpha1.ReasonSurgeExceedsBudget || !strings.Contains(c.Message, "agent pool user") || strings.Contains(c.Message, "agent pool system") {
		t.Errorf("condition = %+v, want False naming pool user only", c)
	}

	// Settings that fit turn it True; the warning of the webhook goes too.
	src.settings["user"] = upgrade.Settings{Pool: "user", MaxSurge: "1", DrainTimeout: time.Minute}
	setUpgradeStatus(&status, b, poolNodes(), src, 40*time.Second)
	if c := meta.FindStatusCondition(status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition = %+v, want True", c)
	}
	if w := UpgradeWarnings(b, poolNodes(), src.settings, 40*time.Second); len(w) != 0 {
		t.Errorf("warnings %q for settings that fit", w)
	}
}

func TestUpgradeStatusUsesTheRoomOutsideWindows(t *testing.T) {
	src := pools{settings: map[string]upgrade.Settings{"user": {Pool: "user", MaxSurge: "2", DrainTimeout: time.Minute}}}
	// A window that allows nothing, always open: upgrades are planned
	// outside it, so the room is the budget's 2.
	b := ndb(maxUnavailable("2"), window("* * * * *", time.Hour, nil))
	var status ngv1alpha1.NodeDisruptionBudgetStatus
	setUpgradeStatus(&status, b, poolNodes(), src, 10*time.Minute)
	if c := meta.FindStatusCondition(status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition = %+v, want True: 2 at once within a room of 2", c)
	}
}

func TestUpgradeStatusWithoutSettings(t *testing.T) {
	b := ndb(maxUnavailable("1"))
	status := ngv1alpha1.NodeDisruptionBudgetStatus{
		AgentPools: []ngv1alpha1.AgentPoolUpgrade{{Name: "user"}},
		Conditions: []metav1.Condition{{Type: ngv1alpha1.ConditionUpgradeSettingsFit, Status: metav1.ConditionFalse}},
	}
	t.Run("a failed read keeps what was said and says it is unknown", func(t *testing.T) {
		s := *status.DeepCopy()
		setUpgradeStatus(&s, b, poolNodes(), pools{err: errors.New("403")}, time.Minute)
		c := meta.FindStatusCondition(s.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
		if len(s.AgentPools) != 1 || c == nil || c.Status != metav1.ConditionUnknown || !strings.Contains(c.Message, "403") {
			t.Errorf("status = %+v, want the pools kept and Unknown naming the error", s)
		}
	})
	t.Run("before the first read, what was said stands", func(t *testing.T) {
		s := *status.DeepCopy()
		setUpgradeStatus(&s, b, poolNodes(), pools{err: upgrade.ErrNotRead}, time.Minute)
		if c := meta.FindStatusCondition(s.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); len(s.AgentPools) != 1 || c == nil || c.Status != metav1.ConditionFalse {
			t.Errorf("status = %+v, want it as it was", s)
		}
	})
	t.Run("no source removes both", func(t *testing.T) {
		s := *status.DeepCopy()
		setUpgradeStatus(&s, b, poolNodes(), nil, time.Minute)
		if len(s.AgentPools) != 0 || len(s.Conditions) != 0 {
			t.Errorf("status = %+v, want no agent pools and no condition", s)
		}
	})
	t.Run("nodes of no known pool leave no condition", func(t *testing.T) {
		s := *status.DeepCopy()
		setUpgradeStatus(&s, b, []*corev1.Node{node("loose")}, pools{settings: map[string]upgrade.Settings{}}, time.Minute)
		if len(s.AgentPools) != 0 || len(s.Conditions) != 0 {
			t.Errorf("status = %+v, want no agent pools and no condition", s)
		}
	})
}
