package karpenter

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// NodeClaimGVK is Karpenter's NodeClaim, read as metadata only.
var NodeClaimGVK = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaim"}

// +kubebuilder:rbac:groups=karpenter.sh,resources=nodeclaims,verbs=get

// OwnerNodeClaim returns the reference to the NodeClaim that Karpenter puts
// on every node it registers (nil for other nodes).
func OwnerNodeClaim(node *corev1.Node) *metav1.OwnerReference {
	for i, ref := range node.OwnerReferences {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && gv.Group == NodeClaimGVK.Group && ref.Kind == NodeClaimGVK.Kind {
			return &node.OwnerReferences[i]
		}
	}
	return nil
}

// OwningNodeClaim reads the metadata of the NodeClaim that owns the node, nil
// when none does (no owner reference, no NodeClaim of that UID, or no
// NodeClaim API).
func OwningNodeClaim(ctx context.Context, reader client.Reader, node *corev1.Node) (*metav1.PartialObjectMetadata, error) {
	ref := OwnerNodeClaim(node)
	if ref == nil {
		return nil, nil
	}
	claim := &metav1.PartialObjectMetadata{}
	claim.SetGroupVersionKind(NodeClaimGVK)
	err := reader.Get(ctx, client.ObjectKey{Name: ref.Name}, claim)
	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading NodeClaim %s of node %s: %w", ref.Name, node.Name, err)
	case claim.UID != ref.UID:
		return nil, nil
	}
	return claim, nil
}

// Finalized reports whether the node carries Karpenter's termination
// finalizer: Karpenter then drains the node and deletes its instance itself,
// once the node is deleting.
func Finalized(node *corev1.Node) bool {
	return slices.Contains(node.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer)
}

// Terminates says how Karpenter is already terminating the node, "" when it
// is not. Karpenter puts its termination finalizer on every node it
// registers, so the finalizer alone says nothing; Karpenter terminates a node
// by deleting its NodeClaim, and that DELETE is where the node's budgets
// applied (the NodeClaim webhook). A NodeClaim outside the webhook's
// objectSelector (the managed selector) charged nothing, and a NodeClaim that
// is gone while its node is not deleting was removed by force: both leave the
// Node DELETE to the budgets.
func Terminates(ctx context.Context, reader client.Reader, managed labels.Selector, node *corev1.Node) (string, error) {
	if !Finalized(node) {
		return "", nil
	}
	claim, err := OwningNodeClaim(ctx, reader, node)
	if err != nil || claim == nil || claim.DeletionTimestamp == nil || !managed.Matches(labels.Set(claim.Labels)) {
		return "", err
	}
	return fmt.Sprintf("its NodeClaim %s is being deleted, and that delete was charged to the node's budgets", claim.Name), nil
}

// Disrupted reports whether the node carries Karpenter's disrupted taint.
func Disrupted(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.KarpenterDisruptedTaintKey })
}
