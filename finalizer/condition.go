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

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// conditionRefresh spaces the changes of the Terminating condition's message
// within one phase (the pods left, a PDB's numbers): every status write of a
// node goes to every watcher of nodes, and a fleet's drains would write each
// node every few seconds for minutes. A new phase is staged at once.
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
	due := last.reason != reason || last.message != message
	if due && last.reason == reason && now.Sub(last.at) < conditionRefresh {
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

// stagedConditions are the condition changes of a node not written yet:
// conditions to set, and types to remove. since is when the oldest of them
// was staged (Options.StatusSettle).
type stagedConditions struct {
	set    []corev1.NodeCondition
	remove []corev1.NodeConditionType
	since  time.Time
}

// stageCondition sets one of nodeguard's node conditions in the node's next
// status write (flushConditions), keeping its transition time while its
// status stays, and on node, for the rest of the pass to read. A pass writes
// the node's status at most once, at its end: every write of a node goes to
// every watcher of nodes (a fleet's worth of components), and a write before
// the first eviction held the eviction back by a round trip.
func (r *Reconciler) stageCondition(node *corev1.Node, c corev1.NodeCondition) {
	now := metav1.NewTime(r.Clock.Now())
	if c.LastHeartbeatTime.IsZero() {
		c.LastHeartbeatTime = now
	}
	c.LastTransitionTime = now
	if old := nodeCondition(node, c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		*old = c
	} else {
		node.Status.Conditions = append(node.Status.Conditions, c)
	}
	r.stage(node.UID, func(s *stagedConditions) {
		s.remove = slices.DeleteFunc(s.remove, func(t corev1.NodeConditionType) bool { return t == c.Type })
		s.set = append(slices.DeleteFunc(s.set, func(o corev1.NodeCondition) bool { return o.Type == c.Type }), c)
	})
}

// stageRemoval removes a condition in the pass's status write.
func (r *Reconciler) stageRemoval(node *corev1.Node, typ corev1.NodeConditionType) {
	node.Status.Conditions = slices.DeleteFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == typ })
	r.stage(node.UID, func(s *stagedConditions) {
		s.set = slices.DeleteFunc(s.set, func(o corev1.NodeCondition) bool { return o.Type == typ })
		s.remove = append(s.remove, typ)
	})
}

func (r *Reconciler) stage(uid types.UID, change func(*stagedConditions)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.remember(uid)
	if m.staged == nil {
		m.staged = &stagedConditions{}
	}
	if m.staged.since.IsZero() {
		m.staged.since = r.Clock.Now()
	}
	change(m.staged)
}

// overlayStaged applies the changes staged and not written yet to a node read
// for a pass, which then reads its conditions as it will write them.
func (r *Reconciler) overlayStaged(node *corev1.Node) {
	r.mu.Lock()
	var staged stagedConditions
	if m := r.memory[node.UID]; m != nil && m.staged != nil {
		staged = *m.staged
	}
	r.mu.Unlock()
	for _, c := range staged.set {
		if old := nodeCondition(node, c.Type); old != nil {
			*old = c
		} else {
			node.Status.Conditions = append(node.Status.Conditions, c)
		}
	}
	for _, typ := range staged.remove {
		node.Status.Conditions = slices.DeleteFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == typ })
	}
}

// flushConditions writes the staged changes once the oldest of them has
// waited Options.StatusSettle, and otherwise says how long until then. A
// phase that ends sooner (Azure confirming within a second, a drain that
// empties the node at once) is never written: the node's release, or the
// next phase, makes it moot.
func (r *Reconciler) flushConditions(ctx context.Context, node *corev1.Node) (heldFor time.Duration, err error) {
	r.mu.Lock()
	var staged *stagedConditions
	if m := r.memory[node.UID]; m != nil && m.staged != nil {
		if wait := r.Opts.StatusSettle - r.Clock.Since(m.staged.since); wait > 0 {
			r.mu.Unlock()
			return wait, nil
		}
		staged, m.staged = m.staged, nil
	}
	r.mu.Unlock()
	return 0, r.writeConditions(ctx, node, staged)
}

// flushConditionsNow writes the staged changes whatever their age.
func (r *Reconciler) flushConditionsNow(ctx context.Context, node *corev1.Node) error {
	r.mu.Lock()
	var staged *stagedConditions
	if m := r.memory[node.UID]; m != nil {
		staged, m.staged = m.staged, nil
	}
	r.mu.Unlock()
	return r.writeConditions(ctx, node, staged)
}

// dropStaged forgets the staged changes of a node that goes.
func (r *Reconciler) dropStaged(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.memory[uid]; m != nil {
		m.staged = nil
	}
}

// writeConditions writes staged changes in one strategic merge patch keyed by
// type, which leaves the kubelet's conditions alone. On failure the next
// pass stages them again: they are derived from the node, and the
// Terminating condition's record is dropped.
func (r *Reconciler) writeConditions(ctx context.Context, node *corev1.Node, staged *stagedConditions) error {
	if staged == nil || len(staged.set)+len(staged.remove) == 0 {
		return nil
	}
	entries := make([]any, 0, len(staged.set)+len(staged.remove))
	for _, c := range staged.set {
		entries = append(entries, c)
	}
	for _, t := range staged.remove {
		entries = append(entries, map[string]any{"$patch": "delete", "type": t})
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": entries}})
	if err == nil {
		err = r.Client.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch))
	}
	if client.IgnoreNotFound(err) != nil {
		r.mu.Lock()
		if m := r.memory[node.UID]; m != nil {
			m.condition = writtenCondition{}
		}
		r.mu.Unlock()
		return fmt.Errorf("writing the node's conditions: %w", err)
	}
	return nil
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
