package webhook_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestBudgetBindsADeleteOnAReplicaThatHasNotSeenIt (issue #61): a budget
// created, or re-selected onto a node, just before the node's DELETE binds
// that DELETE on a replica whose informer has not seen the budget yet, as a
// PodDisruptionBudget binds an eviction: every decision lists the budgets
// consistently from kube-apiserver. The replica's budget watch is held back
// from the moment its cache synced, so its cache provably lacks the budget
// (or has its old selector) before and after each decision. 20 rounds, each a
// fresh node under maxUnavailable 0: a budget created, or one that selected
// other nodes re-selected, then the DELETE at once (429 while the budget is
// not evaluated yet) or once the leader has evaluated it (403: it allows no
// disruption).
func TestBudgetBindsADeleteOnAReplicaThatHasNotSeenIt(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const rounds = 20
	ctx := context.Background()
	prefix := fmt.Sprintf("fresh%d", freshRuns.Add(1)) // -count=N reuses the cluster
	gate := &watchGate{}
	mgr, addr, answers := newManagerFor(t, gate.config(env.Config, "/apis/"+ngv1alpha1.GroupVersion.String()+"/nodedisruptionbudgets"))
	setupGuard(t, mgr, false, false, nil)
	lagging := run(t, mgr, addr, answers)
	// The leader evaluates the budgets (its own cache is not held back); every
	// admission goes to the lagging replica.
	startGuard(t, false)
	useGuards(t, lagging)

	// The budgets to re-select exist, each selecting no node yet, and are in
	// the lagging replica's cache before its watch is held back.
	reselected := map[int]*ngv1alpha1.NodeDisruptionBudget{}
	for i := range rounds {
		if i%4 < 2 {
			continue
		}
		ndb := builder.NDB(fmt.Sprintf("%s-reselect-%d", prefix, i), builder.NDBSelecting("pool", fmt.Sprintf("%s-none-%d", prefix, i)),
			builder.NDBMaxUnavailable("0"))
		if err := env.Client.Create(ctx, ndb); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
		reselected[i] = ndb
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var list ngv1alpha1.NodeDisruptionBudgetList
		if err := lagging.cache.List(ctx, &list); err != nil {
			return false, err
		}
		seen := 0
		for _, b := range list.Items {
			for _, r := range reselected {
				if r.Name == b.Name {
					seen++
				}
			}
		}
		return seen == len(reselected), nil
	}, "the lagging replica's cache has the %d budgets to re-select", len(reselected))
	gate.hold()

	codes := map[int32]int{}
	for i := range rounds {
		pool := fmt.Sprintf("%s-%d", prefix, i)
		node := createReadyNodes(t, pool, 1, builder.WithFinalizers(ngv1alpha1.TerminationFinalizer))[0]
		t.Cleanup(func() { releaseNode(node) })
		var name, how string
		if ndb := reselected[i]; ndb != nil {
			how, name = "re-selected", ndb.Name
			ndb = getBudget(t, name)
			ndb.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}}
			if err := env.Client.Update(ctx, ndb); err != nil {
				t.Fatal(err)
			}
		} else {
			how, name = "created", pool
			ndb := builder.NDB(name, builder.NDBSelecting("pool", pool), builder.NDBMaxUnavailable("0"))
			if err := env.Client.Create(ctx, ndb); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
		}
		evaluated := i%2 == 1
		if evaluated {
			harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
				b := getBudget(t, name)
				return b.Status.ObservedGeneration == b.Generation && b.Status.ExpectedNodes == 1, nil
			}, "the leader evaluates budget %s over node %s", name, node)
		}
		requireUnseen(t, lagging, name, pool)
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
		requireUnseen(t, lagging, name, pool)
		if status, ok := err.(apierrors.APIStatus); ok {
			codes[status.Status().Code]++
		}
		want := fmt.Sprintf("NodeDisruptionBudget %q", name)
		switch {
		case err == nil:
			t.Errorf("round %d: the DELETE of node %s was admitted on a replica that has not seen budget %s (%s, maxUnavailable 0)", i, node, name, how)
		case !strings.Contains(err.Error(), want):
			t.Errorf("round %d: the DELETE of node %s was refused, but not by budget %s (%s): %v", i, node, name, how, err)
		case evaluated && !apierrors.IsForbidden(err):
			t.Errorf("round %d (%s, evaluated): the DELETE of node %s was refused with %v, want 403", i, how, node, err)
		}
	}
	t.Logf("%d DELETEs on the lagging replica, refused by code: %v", rounds, codes)
}

// freshRuns numbers the runs of TestBudgetBindsADeleteOnAReplicaThatHasNotSeenIt.
var freshRuns atomic.Int32

// requireUnseen fails the test unless the lagging replica's cache lacks the
// budget or has it selecting other nodes than pool: else the round proves
// nothing.
func requireUnseen(t *testing.T, g *guard, name, pool string) {
	t.Helper()
	var ndb ngv1alpha1.NodeDisruptionBudget
	err := g.cache.Get(context.Background(), client.ObjectKey{Name: name}, &ndb)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		t.Fatal(err)
	case ndb.Spec.Selector != nil && ndb.Spec.Selector.MatchLabels["pool"] == pool:
		t.Fatalf("the lagging replica's cache has seen budget %s select pool %s: the test proves nothing", name, pool)
	}
}

// releaseNode removes the finalizer of a node the test let be deleted.
func releaseNode(name string) {
	ctx := context.Background()
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil || node.DeletionTimestamp == nil {
		return
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Finalizers = nil
	_ = env.Client.Patch(ctx, &node, patch)
}

// watchGate holds back the watch streams of one resource: once held, what a
// stream brings is never delivered (the informer sees nothing more), until
// the stream is closed.
type watchGate struct{ held atomic.Bool }

func (g *watchGate) hold() { g.held.Store(true) }

// config returns cfg with the watches of path gated.
func (g *watchGate) config(cfg *rest.Config, path string) *rest.Config {
	return wrapWatches(cfg, path, func(body io.ReadCloser) io.ReadCloser { return newLaggingBody(body, 0, g.held.Load) })
}
