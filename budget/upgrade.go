package budget

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/upgrade"
)

// DefaultUpgradeNodeTime is --upgrade-node-time's default: how long an AKS
// upgrade keeps one node out (its drain, reimage and boot).
const DefaultUpgradeNodeTime = 10 * time.Minute

// UpgradeJudgements judges an AKS upgrade of each agent pool of the selected
// nodes (by their kubernetes.azure.com/agentpool label) under the budget:
// how many nodes it drains at once against the room the budget has outside
// its windows (an upgrade is planned for when no window is open). Nodes in
// no agent pool, and pools the settings do not know, are left out.
func UpgradeJudgements(ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, pools map[string]upgrade.Settings, nodeTime time.Duration) []upgrade.Judgement {
	perPool := map[string]int{}
	for _, node := range selected {
		if pool := node.Labels[ngv1alpha1.AgentPoolLabel]; pool != "" {
			perPool[pool]++
		}
	}
	spec := ndb.Spec.DeepCopy()
	spec.Windows = nil
	desired, _, err := desiredAvailable(spec, int32(len(selected)), time.Time{})
	if err != nil {
		return nil
	}
	room := max(len(selected)-int(desired), 0)
	var out []upgrade.Judgement
	for _, name := range slices.Sorted(maps.Keys(perPool)) {
		if s, ok := pools[name]; ok {
			out = append(out, upgrade.Judge(s, perPool[name], room, nodeTime))
		}
	}
	return out
}

// setUpgradeStatus writes status.agentPools and the UpgradeSettingsFit
// condition from the agent pools' settings; without a source, or for a
// budget of no agent pool's nodes, it removes both.
func setUpgradeStatus(status *ngv1alpha1.NodeDisruptionBudgetStatus, ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, src upgrade.Source, nodeTime time.Duration) {
	if src == nil {
		status.AgentPools = nil
		meta.RemoveStatusCondition(&status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
		return
	}
	pools, err := src.AgentPools()
	if errors.Is(err, upgrade.ErrNotRead) {
		return // what was said before the restart stands until the first read
	}
	if pools == nil && err != nil {
		if inAgentPool(selected) {
			meta.SetStatusCondition(&status.Conditions, metav1.Condition{
				Type: ngv1alpha1.ConditionUpgradeSettingsFit, Status: metav1.ConditionUnknown, ObservedGeneration: ndb.Generation,
				Reason: ngv1alpha1.ReasonSettingsUnreadable, Message: "reading the agent pools' upgrade settings from Azure: " + err.Error(),
			})
		}
		return // keep what was last written
	}
	judged := UpgradeJudgements(ndb, selected, pools, nodeTime)
	status.AgentPools = agentPoolStatus(judged, pools)
	if len(judged) == 0 {
		meta.RemoveStatusCondition(&status.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
		return
	}
	meta.SetStatusCondition(&status.Conditions, upgradeCondition(judged, ndb.Generation))
}

func inAgentPool(nodes []*corev1.Node) bool {
	return slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Labels[ngv1alpha1.AgentPoolLabel] != "" })
}

func agentPoolStatus(judged []upgrade.Judgement, pools map[string]upgrade.Settings) []ngv1alpha1.AgentPoolUpgrade {
	var out []ngv1alpha1.AgentPoolUpgrade
	for _, j := range judged {
		s := pools[j.Pool]
		p := ngv1alpha1.AgentPoolUpgrade{
			Name: j.Pool, Nodes: int32(j.Nodes), MaxSurge: s.MaxSurge, MaxUnavailable: s.MaxUnavailable,
			DrainTimeoutInMinutes:     int32(s.EffectiveDrainTimeout() / time.Minute),
			NodeSoakDurationInMinutes: int32(s.NodeSoak / time.Minute),
			UndrainableNodeBehavior:   s.UndrainableNodeBehavior,
			ConcurrentDrains:          int32(j.Concurrent),
		}
		if j.LongestWait >= 0 {
			p.LongestWait = &metav1.Duration{Duration: j.LongestWait}
		}
		out = append(out, p)
	}
	return out
}

// upgradeCondition is True when every pool's upgrade fits, else False with
// the message of each pool that does not.
func upgradeCondition(judged []upgrade.Judgement, generation int64) metav1.Condition {
	c := metav1.Condition{Type: ngv1alpha1.ConditionUpgradeSettingsFit, ObservedGeneration: generation}
	var unfit, fit []string
	for _, j := range judged {
		if j.Fits {
			fit = append(fit, j.Message)
		} else {
			unfit = append(unfit, j.Message)
		}
	}
	if len(unfit) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ngv1alpha1.ReasonSurgeExceedsBudget, strings.Join(unfit, "; ")
		return c
	}
	c.Status, c.Reason, c.Message = metav1.ConditionTrue, ngv1alpha1.ReasonUpgradeSettingsFit, strings.Join(fit, "; ")
	return c
}

// UpgradeWarnings are what the budget webhook says of a budget being written
// whose room an agent pool's upgrade settings do not fit.
func UpgradeWarnings(ndb *ngv1alpha1.NodeDisruptionBudget, selected []*corev1.Node, pools map[string]upgrade.Settings, nodeTime time.Duration) []string {
	var out []string
	for _, j := range UpgradeJudgements(ndb, selected, pools, nodeTime) {
		if !j.Fits {
			out = append(out, fmt.Sprintf("an AKS upgrade would outlast its drain timeout under this budget: %s", j.Message))
		}
	}
	return out
}
