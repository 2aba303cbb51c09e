package harness

import (
	"context"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// NodePatchRacedOnce returns a client of the env's API server whose first
// Node patch comes right after another writer's: write changes the node as
// read fresh, so a patch carrying an optimistic lock gets a real 409 from
// kube-apiserver. raced reports whether it happened.
func NodePatchRacedOnce(t testing.TB, e *Env, write func(*corev1.Node)) (c client.Client, raced func() bool) {
	t.Helper()
	direct, err := client.NewWithWatch(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	c = interceptor.NewClient(direct, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && done.CompareAndSwap(false, true) {
				var other corev1.Node
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &other); err != nil {
					return err
				}
				before := other.DeepCopy()
				write(&other)
				if err := c.Patch(ctx, &other, client.MergeFrom(before)); err != nil {
					return err
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	return c, done.Load
}
