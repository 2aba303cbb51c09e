package finalizer

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// conditionRefresh spaces the changes of the Terminating condition's message
// within one phase (the pods left, a PDB's numbers): every status write of a
// node goes to every watcher of nodes, and a fleet's drains would write each
// node every few seconds for minutes. A new phase is staged at once, and so is
// any change while the condition staged is not written yet.
const conditionRefresh = 30 * time.Second

// conditionReasons name the phases in the condition (CamelCase, as reasons are).
var conditionReasons = map[string]string{
	phaseLease:     "WaitingForMaintenanceLease",
	phaseCordon:    "Cordoning",
	phaseTraffic:   "CuttingTraffic",
	phaseDrainSlot: "WaitingForDrainSlot",
	phaseDrain:     "Draining",
	phaseVolumes:   "WaitingForVolumeDetach",
	phaseRelease:   "Releasing",
}

// waitFor records what the node's current phase waits for, for the condition.
func (r *Reconciler) waitFor(uid types.UID, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remember(uid).waitingFor = fmt.Sprintf(format, args...)
}

// reportCondition sets the node condition nodeguard.io/Terminating: its reason
// is the phase, its message what the phase waits for. It answers "why is my
// node still here?" in kubectl describe node. It is staged for the pass's
// status write (flushConditions).
//
// A change held back by the interval returns when it is due, for the caller
// to look again then: the drain no longer polls, and the condition must not
// lag.
func (r *Reconciler) reportCondition(node *corev1.Node, phase string) (heldFor time.Duration) {
	r.mu.Lock()
	m := r.remember(node.UID)
	message := m.waitingFor
	if message == "" {
		message = "waiting in phase " + phase
	}
	reason := conditionReasons[phase]
	last := m.condition
	now := r.Clock.Now()
	// Not written yet, the staged condition takes the new detail for free.
	unwritten := m.staged != nil && slices.ContainsFunc(m.staged.set, func(c corev1.NodeCondition) bool {
		return c.Type == ngv1alpha1.TerminatingCondition
	})
	due := last.reason != reason || last.message != message
	if due && last.reason == reason && !unwritten && now.Sub(last.at) < conditionRefresh {
		due = false // same phase, new detail: wait for the interval
		heldFor = conditionRefresh - now.Sub(last.at)
	}
	if due {
		m.condition = writtenCondition{reason: reason, message: message, at: now}
	}
	r.mu.Unlock()
	if due {
		r.stageTerminating(node, reason, message, now)
	}
	return heldFor
}

type writtenCondition struct {
	reason, message string
	at              time.Time
}

func (r *Reconciler) stageTerminating(node *corev1.Node, reason, message string, now time.Time) {
	r.stageCondition(node, corev1.NodeCondition{
		Type: ngv1alpha1.TerminatingCondition, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastHeartbeatTime: metav1.NewTime(now),
	})
}

func nodeCondition(node *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == typ {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// keptByOthers reports whether another finalizer keeps the node once
// nodeguard releases it; when nodeguard's is the last, the node goes.
func (r *Reconciler) keptByOthers(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Finalizers, func(f string) bool { return f != ngv1alpha1.TerminationFinalizer })
}

// removeCondition takes the Terminating condition off a node that another
// finalizer keeps after nodeguard releases it.
func (r *Reconciler) removeCondition(node *corev1.Node) {
	if nodeCondition(node, ngv1alpha1.TerminatingCondition) != nil {
		r.stageRemoval(node, ngv1alpha1.TerminatingCondition)
	}
}
