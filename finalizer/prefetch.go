package finalizer

import (
	"context"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// prefetch reads the ReplicaSets, then the Deployments, of the surveyed
// queues' pods all at once: read one after another, they held the node's
// first evictions back by a round trip per workload. A read that fails is
// left for decide to retry and report.
func (p *replacePass) prefetch(ctx context.Context, plan *drain.Plan, settles []settle) {
	var rsKeys []types.NamespacedName
	for i := range plan.Groups {
		if !settles[i].surveyed {
			continue
		}
		for _, pod := range plan.Groups[i].Pods {
			if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "ReplicaSet" && ref.APIVersion == appsv1.SchemeGroupVersion.String() {
				rsKeys = append(rsKeys, types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name})
			}
		}
	}
	fetchAll(ctx, p.r.Reader, p.replicaSets, rsKeys, func() *appsv1.ReplicaSet { return &appsv1.ReplicaSet{} })
	var dKeys []types.NamespacedName
	for key, rs := range p.replicaSets {
		if rs == nil {
			continue
		}
		if ref := metav1.GetControllerOf(rs); ref != nil && ref.Kind == "Deployment" {
			dKeys = append(dKeys, types.NamespacedName{Namespace: key.Namespace, Name: ref.Name})
		}
	}
	fetchAll(ctx, p.r.Reader, p.deployments, dKeys, func() *appsv1.Deployment { return &appsv1.Deployment{} })
}

// prefetchConcurrency bounds the reads prefetch has in flight at once.
const prefetchConcurrency = 8

// fetchAll reads the keys not yet in seen, several at once, as get would.
func fetchAll[T client.Object](ctx context.Context, reader client.Reader, seen map[types.NamespacedName]T, keys []types.NamespacedName, newObj func() T) {
	var todo []types.NamespacedName
	queued := map[types.NamespacedName]bool{}
	for _, key := range keys {
		if _, ok := seen[key]; !ok && !queued[key] {
			queued[key] = true
			todo = append(todo, key)
		}
	}
	objs, errs := make([]T, len(todo)), make([]error, len(todo))
	slots := make(chan struct{}, prefetchConcurrency)
	var wg sync.WaitGroup
	for i, key := range todo {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			objs[i] = newObj()
			errs[i] = reader.Get(ctx, key, objs[i])
		})
	}
	wg.Wait()
	for i, key := range todo {
		switch {
		case errs[i] == nil:
			seen[key] = objs[i]
		case apierrors.IsNotFound(errs[i]):
			var none T
			seen[key] = none
		}
		// Any other error: decide reads it again and reports it.
	}
}

// get reads an object from the API server once per pass; nil when not found.
func get[T client.Object](ctx context.Context, reader client.Reader, seen map[types.NamespacedName]T, key types.NamespacedName, obj T) (T, error) {
	if o, ok := seen[key]; ok {
		return o, nil
	}
	var none T
	if err := reader.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			seen[key] = none
			return none, nil
		}
		return none, fmt.Errorf("reading %T %s: %w", obj, key, err)
	}
	seen[key] = obj
	return obj, nil
}
