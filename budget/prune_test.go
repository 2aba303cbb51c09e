package budget

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// TestListFreshReadsTheBudgetsNodesAPageAtATime: at fleet size a budget
// selects thousands of nodes, and the List that confirms many claims reads
// them a page at a time. A claimed node on any page is found, a node on none
// is gone, and no page asks for more than listFreshPage nodes.
func TestListFreshReadsTheBudgetsNodesAPageAtATime(t *testing.T) {
	const selected = 2*listFreshPage + 100
	var objs []client.Object
	for i := range selected {
		objs = append(objs, node(fmt.Sprintf("n-%04d", i)))
	}
	var pages []int64
	reader := fake.NewClientBuilder().WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		// The fake client ignores Limit and Continue: page as kube-apiserver does.
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			o := (&client.ListOptions{}).ApplyOptions(opts)
			pages = append(pages, o.Limit)
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			nodes := list.(*corev1.NodeList)
			slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
			from, _ := slices.BinarySearchFunc(nodes.Items, o.Continue, func(n corev1.Node, after string) int {
				if n.Name <= after {
					return -1
				}
				return 1
			})
			nodes.Items, nodes.Continue = nodes.Items[from:], ""
			if o.Limit > 0 && int64(len(nodes.Items)) > o.Limit {
				nodes.Items = nodes.Items[:o.Limit]
				nodes.Continue = nodes.Items[o.Limit-1].Name
			}
			return nil
		},
	}).Build()
	r := &StatusReconciler{Reader: reader, ClaimTimeout: 2 * time.Minute, UnconfirmedTimeout: 15 * time.Second}
	claimed := map[string]metav1.Time{}
	present := []string{"n-0000", fmt.Sprintf("n-%04d", listFreshPage), fmt.Sprintf("n-%04d", selected-1)}
	for _, name := range present {
		claimed[name] = metav1.NewTime(now.Add(-time.Second))
	}
	for i := range listFreshAbove {
		claimed[fmt.Sprintf("gone-%d", i)] = metav1.NewTime(now.Add(-time.Second))
	}
	// The cache has not seen the claimed nodes yet: each needs a fresh read.
	review := r.newClaimReview(ndb(maxUnavailable("10%")), []*corev1.Node{node("cached")})
	if err := review.readFresh(context.Background(), claimed, now); err != nil {
		t.Fatal(err)
	}
	if want := []int64{listFreshPage, listFreshPage, listFreshPage}; !slices.Equal(pages, want) {
		t.Errorf("listed pages of %v nodes, want %v", pages, want)
	}
	kept, _ := review.prune(claimed, now)
	if len(kept) != len(present) {
		t.Errorf("kept claims %v, want those of %v (listed on pages 1 to 3); the others' nodes are gone", kept, present)
	}
	for _, name := range present {
		if _, ok := kept[name]; !ok || review.fresh[name] == nil || review.fresh[name].Name != name {
			t.Errorf("node %s: claim kept %v, read %v", name, ok, review.fresh[name])
		}
	}
}
