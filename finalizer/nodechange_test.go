package finalizer

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// TestTerminatingNodeChanged: a terminating node's heartbeats and nodeguard's
// own conditions (written from what its passes staged) run no pass;
// everything else a pass reads does.
func TestTerminatingNodeChanged(t *testing.T) {
	now := metav1.Now()
	base := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1", DeletionTimestamp: &now, Finalizers: []string{ngv1alpha1.TerminationFinalizer}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now},
		}},
	}
	later := metav1.NewTime(now.Add(10 * time.Second))
	cases := []struct {
		name   string
		change func(*corev1.Node)
		want   bool
	}{
		{"heartbeat", func(n *corev1.Node) { n.ResourceVersion = "2"; n.Status.Conditions[0].LastHeartbeatTime = later }, false},
		{"nodeguard's conditions", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions,
				corev1.NodeCondition{Type: ngv1alpha1.TerminatingCondition, Status: corev1.ConditionTrue, Message: "waiting"},
				corev1.NodeCondition{Type: ngv1alpha1.TrafficCutCondition, Status: corev1.ConditionTrue},
				corev1.NodeCondition{Type: corev1.NodeDrainInProgress, Status: corev1.ConditionFalse},
				corev1.NodeCondition{Type: corev1.NodeDrained, Status: corev1.ConditionTrue})
		}, false},
		{"Ready turns Unknown", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown }, true},
		{"a taint", func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoExecute}} }, true},
		{"an annotation", func(n *corev1.Node) { n.Annotations = map[string]string{ngv1alpha1.DrainedAtAnnotation: "now"} }, true},
		{"a finalizer more", func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, "other") }, true},
		{"the finalizer gone", func(n *corev1.Node) { n.Finalizers = nil }, false}, // not terminating under it any more
	}
	p := terminatingNodeChanged()
	for _, c := range cases {
		cur := base.DeepCopy()
		c.change(cur)
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: cur}); got != c.want {
			t.Errorf("%s: pass %v, want %v", c.name, got, c.want)
		}
	}
	alive := base.DeepCopy()
	alive.DeletionTimestamp = nil
	if !p.Update(event.UpdateEvent{ObjectOld: alive, ObjectNew: base}) {
		t.Error("a node being deleted ran no pass")
	}
}

// TestChargedNodeIsWatchedWhileOutsideDrainsAreOff: with outside drains no
// longer followed, a node still marked by a drain charged before runs a pass
// when it is uncordoned (and at the initial list), so that its marks go; an
// unmarked node's changes run none.
func TestChargedNodeIsWatchedWhileOutsideDrainsAreOff(t *testing.T) {
	r := &Reconciler{Outside: &OutsideDrains{Off: true}} // --outside-drains=false
	p := nodeChanged(r.watchedOutside)
	cordoned := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "1",
		Annotations: map[string]string{ngv1alpha1.DrainChargedAtAnnotation: "2026-12-01T10:00:00Z"}}, Spec: corev1.NodeSpec{Unschedulable: true}}
	back := cordoned.DeepCopy()
	back.ResourceVersion, back.Spec.Unschedulable = "2", false
	if !p.Update(event.UpdateEvent{ObjectOld: cordoned, ObjectNew: back}) {
		t.Error("the uncordon of a node marked by a charged drain ran no pass")
	}
	if !p.Create(event.CreateEvent{Object: cordoned}) {
		t.Error("the initial list passed over a node marked by a charged drain")
	}
	plainOld, plainNew := cordoned.DeepCopy(), back.DeepCopy()
	plainOld.Annotations, plainNew.Annotations = nil, nil
	if p.Update(event.UpdateEvent{ObjectOld: plainOld, ObjectNew: plainNew}) {
		t.Error("an unmarked node's uncordon ran a pass while outside drains are off")
	}
}
