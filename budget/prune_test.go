package budget

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestReadFreshListsOnceForManyClaims: the claims of a fleet deletion whose
// nodes are gone need a fresh read each before they leave disruptedNodes;
// past a few, one List of the budget's nodes answers them all, and the
// decisions are those the reads one by one would give.
func TestReadFreshListsOnceForManyClaims(t *testing.T) {
	tests := []struct {
		gone                int
		wantGets, wantLists int
	}{
		{gone: 3, wantGets: 4},
		{gone: 20, wantLists: 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d gone", tt.gone), func(t *testing.T) {
			// One claimed node the cache has not seen yet is still there, selected.
			late := node("late")
			var gets, lists int
			reader := fake.NewClientBuilder().WithObjects(late).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					gets++
					return c.Get(ctx, key, obj, opts...)
				},
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					lists++
					return c.List(ctx, list, opts...)
				},
			}).Build()
			r := &StatusReconciler{Reader: reader, ClaimTimeout: 2 * time.Minute, UnconfirmedTimeout: 15 * time.Second}
			b := ndb(maxUnavailable("1"))
			claimed := map[string]metav1.Time{"late": metav1.NewTime(now.Add(-time.Second))}
			for i := range tt.gone {
				claimed[fmt.Sprintf("gone-%d", i)] = metav1.NewTime(now.Add(-time.Second))
			}
			review := r.newClaimReview(b, []*corev1.Node{node("cached")})
			if err := review.readFresh(context.Background(), claimed, now); err != nil {
				t.Fatal(err)
			}
			if gets != tt.wantGets || lists != tt.wantLists {
				t.Errorf("%d Gets and %d Lists, want %d and %d", gets, lists, tt.wantGets, tt.wantLists)
			}
			kept, _ := review.prune(claimed, now)
			if _, ok := kept["late"]; len(kept) != 1 || !ok {
				t.Errorf("kept claims %v, want only the one of node late (still there, not yet cached)", kept)
			}
		})
	}
}
