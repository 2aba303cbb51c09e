package finalizer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// conditionMinInterval spaces the condition's writes for one node: a drain
// pass can run every half second, kubectl describe need not change that often.
const conditionMinInterval = 3 * time.Second

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
	if r.waitingFor == nil {
		r.waitingFor = map[types.UID]string{}
	}
	r.waitingFor[uid] = fmt.Sprintf(format, args...)
}

// reportCondition sets the node condition nodeguard.io/Terminating: its reason
// is the phase, its message what the phase waits for. It answers "why is my
// node still here?" in kubectl describe node. Only that condition is written
// (a strategic merge keyed by type), never the kubelet's.
//
// A change held back by the interval returns when it is due, for the caller
// to look again then: the drain no longer polls, and the condition must not
// lag.
func (r *Reconciler) reportCondition(ctx context.Context, node *corev1.Node, phase string) (heldFor time.Duration) {
	r.mu.Lock()
	message := r.waitingFor[node.UID]
	if message == "" {
		message = "waiting in phase " + phase
	}
	reason := conditionReasons[phase]
	last := r.conditions[node.UID]
	now := r.Clock.Now()
	due := last.reason != reason || last.message != message
	if due && now.Sub(last.at) < conditionMinInterval && last.reason == reason {
		due = false // same phase, new detail: wait for the interval
		heldFor = conditionMinInterval - now.Sub(last.at)
	}
	if due {
		if r.conditions == nil {
			r.conditions = map[types.UID]writtenCondition{}
		}
		r.conditions[node.UID] = writtenCondition{reason: reason, message: message, at: now}
	}
	r.mu.Unlock()
	if !due {
		return heldFor
	}
	if err := r.patchCondition(ctx, node, reason, message, now); err != nil {
		logf.FromContext(ctx).Error(err, "Updating the node's termination condition", "node", node.Name)
		r.mu.Lock()
		delete(r.conditions, node.UID) // try again next pass
		r.mu.Unlock()
	}
	return 0
}

type writtenCondition struct {
	reason, message string
	at              time.Time
}

func (r *Reconciler) patchCondition(ctx context.Context, node *corev1.Node, reason, message string, now time.Time) error {
	return r.patchNodeCondition(ctx, node, corev1.NodeCondition{
		Type: ngv1alpha1.TerminatingCondition, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastHeartbeatTime: metav1.NewTime(now),
	})
}

// patchNodeCondition writes one of nodeguard's node conditions (a strategic
// merge keyed by type, which leaves the kubelet's alone), keeping its
// transition time while its status stays.
func (r *Reconciler) patchNodeCondition(ctx context.Context, node *corev1.Node, c corev1.NodeCondition) error {
	now := metav1.NewTime(r.Clock.Now())
	if c.LastHeartbeatTime.IsZero() {
		c.LastHeartbeatTime = now
	}
	c.LastTransitionTime = now
	if old := nodeCondition(node, c.Type); old != nil && old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}})
	if err != nil {
		return err
	}
	return r.Client.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch))
}

func nodeCondition(node *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == typ {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// removeCondition takes the Terminating condition off a node that another
// finalizer keeps after nodeguard releases it; when nodeguard's finalizer is
// the last, the node goes and the condition with it.
func (r *Reconciler) removeCondition(ctx context.Context, node *corev1.Node) error {
	others := slices.ContainsFunc(node.Finalizers, func(f string) bool { return f != ngv1alpha1.TerminationFinalizer })
	has := slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == ngv1alpha1.TerminatingCondition })
	if !others || !has {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]any{
		{"$patch": "delete", "type": ngv1alpha1.TerminatingCondition},
	}}})
	if err != nil {
		return err
	}
	if err := r.Client.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the %s condition: %w", ngv1alpha1.TerminatingCondition, err)
	}
	return nil
}
