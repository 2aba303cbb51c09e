package drain

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestUnprotectedEvictionsAreBoundedAcrossNodes: with --parallel-evictions=3,
// two nodes draining at once have at most 3 evictions of pods under no PDB in
// flight between them, not 3 each; and a PDB queue's eviction goes at once
// beside them, never behind them (it is the drain's critical path).
func TestUnprotectedEvictionsAreBoundedAcrossNodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu             sync.Mutex
			inFlight, most int
			granted        []string
			answer         = make(chan struct{})
		)
		e := &Evictor{Parallel: 3, Client: fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
			SubResourceCreate: func(_ context.Context, _ client.Client, _ string, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
				mu.Lock()
				bare := obj.GetName() != "web-b"
				if bare {
					inFlight++
					most = max(most, inFlight)
				}
				mu.Unlock()
				if bare {
					<-answer
				}
				mu.Lock()
				defer mu.Unlock()
				if bare {
					inFlight--
				}
				granted = append(granted, obj.GetName())
				return nil
			},
		}).Build()}
		bare := func(node string, n int) []*corev1.Pod {
			var pods []*corev1.Pod
			for i := range n {
				name := fmt.Sprintf("%s-bare-%d", node, i)
				pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}})
			}
			return pods
		}
		pdb := &policyv1.PodDisruptionBudget{}
		pdb.UID, pdb.Generation = "pdb-web", 1
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, DisruptionsAllowed: 1}
		web := pod("web-b", "web", ready)

		outs := make(chan Outcome, 2)
		go func() { outs <- e.Evict(context.Background(), "a", &Plan{Unprotected: bare("a", 4)}) }()
		go func() {
			outs <- e.Evict(context.Background(), "b", &Plan{Unprotected: bare("b", 4),
				Groups: []Group{{UID: pdb.UID, Pods: []*corev1.Pod{&web}, Allowed: 1, Budget: pdb}}})
		}()
		synctest.Wait() // every request that can go has gone, and waits for its answer
		mu.Lock()
		if inFlight != 3 {
			t.Errorf("%d evictions of pods under no PDB in flight across both nodes, want 3 (--parallel-evictions)", inFlight)
		}
		if len(granted) != 1 || granted[0] != "web-b" {
			t.Errorf("evictions answered %v while the unprotected ones waited, want web-b's: a PDB queue does not wait behind them", granted)
		}
		mu.Unlock()

		close(answer)
		evicted := (<-outs).Evicted + (<-outs).Evicted
		if evicted != 9 {
			t.Errorf("%d pods evicted, want all 9", evicted)
		}
		if most != 3 {
			t.Errorf("at most %d evictions of pods under no PDB were in flight, want 3", most)
		}
	})
}
