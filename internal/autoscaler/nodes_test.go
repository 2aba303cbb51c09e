package autoscaler_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestNodeListerReadsTheCacheItself: the budget controllers' node lister
// returns the nodes a selector selects, as the cache's own objects: two lists
// hand out the same pointers, where a cached client's List copies every node
// each time.
func TestNodeListerReadsTheCacheItself(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	pool := fresh("lister")
	names := createNodes(t, pool, 3)
	createNodes(t, fresh("other"), 2)

	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = c.Start(ctx) }()
	lister := budget.NewNodeLister(c)
	sel := labels.SelectorFromSet(labels.Set{"pool": pool})

	var first []*corev1.Node
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		first, err = lister.List(ctx, sel)
		return len(first) == len(names), err
	}, "the lister sees the pool's %d nodes", len(names))
	var got []string
	for _, n := range first {
		got = append(got, n.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("listed %v, want %v", got, names)
	}
	again, err := lister.List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range again {
		if !slices.Contains(first, n) {
			t.Fatalf("node %s was copied between two lists: the lister must hand out the cache's own objects", n.Name)
		}
	}
	if all, err := lister.List(ctx, nil); err != nil || len(all) < 5 {
		t.Fatalf("a nil selector listed %d nodes (%v), want every node", len(all), err)
	}
}
