package finalizer

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// A drain's evictions a user may regret are of pods no controller recreates
// and of pods whose emptyDir data goes with them. Each is said once: in the
// Warning events EvictingPodWithoutController and EvictingPodWithLocalData
// once the drain stalls (drainWaitingAfter without progress) or has lasted
// lossesAfter, or, when the drain ends sooner, in the NodeReleased event,
// which is then a Warning. A fleet's nodes that carry such pods would
// otherwise pay an event more each for what their release says soon after.

// lossesAfter is how long a drain that keeps going may hold its losses for
// NodeReleased: a fleet's drains take a minute or two each.
const lossesAfter = 2 * time.Minute

// podLosses are the evicted pods not said yet, as namespace/name.
type podLosses struct {
	bare, local []string
}

// noteLosses records, once per pod, the pods of the plan about to be evicted
// that no controller manages or that have emptyDir data.
func (r *Reconciler) noteLosses(node *corev1.Node, plan *drain.Plan) {
	pods := append([]*corev1.Pod{}, plan.Unprotected...)
	for _, g := range plan.Groups {
		if !g.Blocked {
			pods = append(pods, g.Pods...)
		}
	}
	for _, pod := range pods {
		name := pod.Namespace + "/" + pod.Name
		if metav1.GetControllerOf(pod) == nil && r.once(node.UID, "bare/"+string(pod.UID)) {
			r.addLoss(node.UID, func(l *podLosses) { l.bare = append(l.bare, name) })
		}
		if hasEmptyDir(pod) && r.once(node.UID, "emptydir/"+string(pod.UID)) {
			r.addLoss(node.UID, func(l *podLosses) { l.local = append(l.local, name) })
		}
	}
}

func (r *Reconciler) addLoss(uid types.UID, add func(*podLosses)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.remember(uid).losses)
}

// takeLosses returns the losses not said yet, and forgets them.
func (r *Reconciler) takeLosses(uid types.UID) podLosses {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.recall(uid)
	l := m.losses
	m.losses = podLosses{}
	return l
}

// reportLosses says the losses not said yet in their Warning events, once
// the drain has lasted lossesAfter, or at once when now is set: the drain
// stalled, or the node goes without a NodeReleased event.
func (r *Reconciler) reportLosses(node *corev1.Node, now bool) {
	if !now && r.Clock.Since(r.drainStarted(node)) < lossesAfter {
		return
	}
	l := r.takeLosses(node.UID)
	if len(l.bare) > 0 {
		r.event(node, corev1.EventTypeWarning, ReasonEvictingBarePod,
			"evicted %s, which no controller manages: nothing will recreate %s", podNames(l.bare), pronoun(len(l.bare), "it", "them"))
	}
	if len(l.local) > 0 {
		r.event(node, corev1.EventTypeWarning, ReasonEvictingLocalData,
			"evicted %s: the data in %s emptyDir volumes is lost", podNames(l.local), pronoun(len(l.local), "its", "their"))
	}
}

// restoreLosses puts back losses taken and not said (a release that failed).
func (r *Reconciler) restoreLosses(uid types.UID, l podLosses) {
	r.addLoss(uid, func(m *podLosses) {
		m.bare, m.local = append(l.bare, m.bare...), append(l.local, m.local...)
	})
}

func (l podLosses) empty() bool { return len(l.bare) == 0 && len(l.local) == 0 }

// note says the losses for the NodeReleased event, e.g. "evicted 2 pods
// ns/a, ns/b, which no controller manages (nothing will recreate them)".
func (l podLosses) note() string {
	var said []string
	if len(l.bare) > 0 {
		said = append(said, fmt.Sprintf("evicted %s, which no controller manages (nothing will recreate %s)", podNames(l.bare), pronoun(len(l.bare), "it", "them")))
	}
	if len(l.local) > 0 {
		said = append(said, fmt.Sprintf("evicted %s with emptyDir data, which is lost", podNames(l.local)))
	}
	return strings.Join(said, "; ")
}

// eventPodsMax bounds the pods an event names.
const eventPodsMax = 10

// podNames is "pod ns/a" or "3 pods ns/a, ns/b, ns/c", at most eventPodsMax
// of them named ("... (5 more)").
func podNames(names []string) string {
	if len(names) == 1 {
		return "pod " + names[0]
	}
	return fmt.Sprintf("%d pods %s", len(names), listUpTo(names[:min(len(names), eventPodsMax)], len(names)))
}

func pronoun(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
