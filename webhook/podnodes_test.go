package webhook

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestPodNodesKeepsEachPodsNode: the locator's store follows the reflector's
// list and events (a pod scheduled, moved, deleted, deleted unseen) and keeps
// only scheduled pods; a pod it has no entry for, and every pod before the
// first list, is read from the API server.
func TestPodNodesKeepsEachPodsNode(t *testing.T) {
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: corev1.PodSpec{NodeName: node}}
	}
	ctx := context.Background()
	p := &PodNodes{nodes: map[string]string{}, Reader: fake.NewClientBuilder().WithObjects(pod("pending", ""), pod("only-in-api", "n9")).Build()}
	s := (*podNodeStore)(p)
	nodeOf := func(name string) string {
		t.Helper()
		node, err := p.NodeOf(ctx, "ns", name)
		if err != nil {
			t.Fatal(err)
		}
		return node
	}
	if got := nodeOf("only-in-api"); got != "n9" {
		t.Errorf("before the first list: %q, want the API server's n9", got)
	}
	if err := s.Replace([]any{pod("a", "n1"), pod("b", "n2"), pod("pending", "")}, "1"); err != nil {
		t.Fatal(err)
	}
	_ = s.Add(pod("c", "n3"))
	_ = s.Update(pod("b", "n4"))
	_ = s.Delete(pod("a", "n1"))
	_ = s.Delete(toolscache.DeletedFinalStateUnknown{Key: "ns/c", Obj: pod("c", "n3")})
	for name, want := range map[string]string{"a": "", "b": "n4", "c": "", "pending": "", "only-in-api": "n9", "nowhere": ""} {
		if got := nodeOf(name); got != want {
			t.Errorf("pod %s on %q, want %q", name, got, want)
		}
	}
	if len(p.nodes) != 1 {
		t.Errorf("the store keeps %d entries (%v), want only b's", len(p.nodes), p.nodes)
	}
}
