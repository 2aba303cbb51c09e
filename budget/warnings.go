package budget

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// warnedReasons are the DisruptionAllowed reasons a user must hear about, as
// nothing else looks wrong: the budget guards no node (its numbers read
// "allowed 0 of max 0"), or it cannot be evaluated and refuses every delete
// under it (a window schedule stored before the budget webhook checked it).
var warnedReasons = map[string]bool{ReasonInvalidSelector: true, ReasonNoMatchingNodes: true, ReasonInvalidSpec: true}

// warnOnTransition records a Warning event when a status write turned the
// budget's DisruptionAllowed condition to one of warnedReasons. Call it
// after the write succeeded, with the status it replaced: a later pass finds
// the reason already set and stays quiet, so each cause is reported once per
// budget (and again only if it goes and comes back), across restarts too.
func (r *StatusReconciler) warnOnTransition(ndb *ngv1alpha1.NodeDisruptionBudget, before, after *ngv1alpha1.NodeDisruptionBudgetStatus) {
	if r.Recorder == nil {
		return
	}
	r.warnOnUnfitUpgrade(ndb, before, after)
	now := meta.FindStatusCondition(after.Conditions, ngv1alpha1.ConditionDisruptionAllowed)
	if now == nil || !warnedReasons[now.Reason] {
		return
	}
	if was := meta.FindStatusCondition(before.Conditions, ngv1alpha1.ConditionDisruptionAllowed); was != nil && was.Reason == now.Reason {
		return
	}
	r.Recorder.Eventf(ndb, nil, corev1.EventTypeWarning, now.Reason, actionEvaluate, "%s", now.Message)
}

// warnOnUnfitUpgrade records a Warning event when a status write turned the
// UpgradeSettingsFit condition False (or changed why): an AKS upgrade of an
// agent pool would wait on the budget past its drain timeout.
func (r *StatusReconciler) warnOnUnfitUpgrade(ndb *ngv1alpha1.NodeDisruptionBudget, before, after *ngv1alpha1.NodeDisruptionBudgetStatus) {
	now := meta.FindStatusCondition(after.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit)
	if now == nil || now.Status != metav1.ConditionFalse {
		return
	}
	if was := meta.FindStatusCondition(before.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); was != nil && was.Status == now.Status && was.Message == now.Message {
		return
	}
	r.Recorder.Eventf(ndb, nil, corev1.EventTypeWarning, now.Reason, actionEvaluate, "%s", now.Message)
}
