package finalizer

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// rollout is how a restart's new pods are doing.
type rollout struct {
	ready int
	// stalled says why the replacement is considered stuck, or "".
	stalled string
}

// rollout lists the Deployment's pods (label selector, from the API server)
// and finds the restart's new pods (they carry its annotation): the
// replacement stalls when one of them is not Ready --replacement-timeout after
// it was created, when none was created that long after the restart, or when
// the Deployment reports its progress deadline exceeded.
func (p *replacePass) rollout(ctx context.Context, d *appsv1.Deployment, at time.Time) (*rollout, error) {
	if ro, ok := p.rollouts[d.UID]; ok {
		return ro, nil
	}
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("Deployment %s/%s has an invalid selector: %w", d.Namespace, d.Name, err)
	}
	var pods corev1.PodList
	if err := p.r.Reader.List(ctx, &pods, client.InNamespace(d.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
		return nil, fmt.Errorf("listing the pods of Deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	timeout := p.r.Opts.ReplacementTimeout
	value := d.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation]
	ro := &rollout{}
	created := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil || pod.Annotations[ngv1alpha1.RestartedAtAnnotation] != value {
			continue
		}
		created++
		age := p.now.Sub(pod.CreationTimestamp.Time)
		switch {
		case drain.PodReady(pod):
			ro.ready++
		case timeout > 0 && age >= timeout && ro.stalled == "":
			ro.stalled = notReadyReason(pod, timeout)
		}
	}
	if created == 0 && timeout > 0 && p.now.Sub(at) >= timeout {
		ro.stalled = fmt.Sprintf("no new pod was created within %s (--replacement-timeout)", timeout)
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			ro.stalled = "the Deployment's progress deadline was exceeded: " + c.Message
		}
	}
	p.rollouts[d.UID] = ro
	return ro, nil
}

// notReadyReason says why a new pod is not Ready, the scheduler's word first.
func notReadyReason(pod *corev1.Pod, timeout time.Duration) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("new pod %s not scheduled within %s (--replacement-timeout): %s", pod.Name, timeout, c.Message)
		}
	}
	return fmt.Sprintf("new pod %s not Ready within %s (--replacement-timeout)", pod.Name, timeout)
}

// reportStall tells, once per node and restart, that nodeguard falls back to
// waiting, and counts the stall once per restart.
func (p *replacePass) reportStall(g *drain.Group, pod *corev1.Pod, d *appsv1.Deployment, at time.Time, ro *rollout) {
	key := string(d.UID) + "/" + ngv1alpha1.FormatTime(at)
	if p.r.repl.countStall(key) {
		replacementRestarts.WithLabelValues(d.Namespace, restartStalled).Inc()
	}
	if !p.r.once(p.node.UID, "stalled/"+key) {
		return
	}
	then := "waiting for PDB " + g.PDB.String() + " to allow a disruption"
	if p.pastDeadline {
		then = "the drain deadline has passed, so its pods on the node are deleted"
	}
	p.r.event(p.node, corev1.EventTypeWarning, ReasonReplacementStalled,
		"the rollout of Deployment %s/%s, restarted at %s to replace pod %s/%s, stalled: %s; nodeguard falls back: %s",
		d.Namespace, d.Name, at.UTC().Format(time.RFC3339), pod.Namespace, pod.Name, ro.stalled, then)
}
