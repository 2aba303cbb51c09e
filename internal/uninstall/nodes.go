package uninstall

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

func removeFinalizer(node *corev1.Node) bool {
	i := slices.Index(node.Finalizers, ngv1alpha1.TerminationFinalizer)
	if i < 0 {
		return false
	}
	node.Finalizers = slices.Delete(node.Finalizers, i, i+1)
	return true
}

// updateNode applies change to a fresh copy of the node and writes it with an
// optimistic lock, retrying on conflicts, and for up to PolicyWait on a
// refusal by a policy binding deleted in step 4; it returns what change
// reported. A node that is gone needs nothing.
func (u *uninstaller) updateNode(ctx context.Context, name string, change func(*corev1.Node) []string) ([]string, error) {
	deadline := time.Now().Add(u.o.PolicyWait)
	for {
		did, err := u.updateNodeOnce(ctx, name, change)
		if !u.refusedByPolicyBinding(err) || time.Now().After(deadline) {
			return did, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(u.o.Poll / 4):
		}
	}
}

func (u *uninstaller) updateNodeOnce(ctx context.Context, name string, change func(*corev1.Node) []string) ([]string, error) {
	var did []string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var node corev1.Node
		if err := u.c.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		did = change(&node)
		if len(did) == 0 {
			return nil
		}
		return u.c.Patch(ctx, &node, patch)
	})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("updating node %s: %w", name, err)
	}
	return did, nil
}
