package finalizer

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// maintenanceLeaseSeconds is the duration nodeguard writes in a node's
// maintenance Lease; it renews once a third of it has passed (the KEP asks a
// holder to renew within an hour).
const maintenanceLeaseSeconds = 600

// holdMaintenanceLease takes the node's maintenance Lease, or renews it, and
// waits while someone else (an administrator's kubeadm... hold, or another
// live holder) has it.
func (r *Reconciler) holdMaintenanceLease(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	now := r.Clock.Now()
	holder := budget.HolderIdentity(r.Opts.Identity)
	if r.stillHeld(ctx, node, holder, now) {
		return reconcile.Result{}, nil
	}
	var lease coordinationv1.Lease
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	if apierrors.IsNotFound(err) {
		return reconcile.Result{}, r.createLease(ctx, node, now)
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("reading maintenance Lease: %w", err)
	}
	if hold := budget.HeldByOther(&lease, now); hold != nil {
		r.waitFor(node.UID, "waiting for maintenance Lease %s/%s: %s", lease.Namespace, lease.Name, hold)
		if r.once(node.UID, "hold/"+hold.Holder) {
			r.event(node, corev1.EventTypeWarning, ReasonWaitingForMaintenanceHold,
				"waiting to drain: maintenance Lease %s/%s is %s", lease.Namespace, lease.Name, hold)
		}
		return reconcile.Result{RequeueAfter: holdPoll}, nil
	}
	if heldFresh(&lease, node, holder, now) {
		return reconcile.Result{}, nil
	}
	current := ptr.Deref(lease.Spec.HolderIdentity, "")
	if current != holder {
		lease.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(now))
		lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	}
	lease.Spec.HolderIdentity = ptr.To(holder)
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](maintenanceLeaseSeconds)
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(now))
	ownedByNode(&lease, node)
	if err := r.Client.Update(ctx, &lease); err != nil {
		return reconcile.Result{}, fmt.Errorf("taking maintenance Lease: %w", err)
	}
	if current != holder {
		r.progress(node.UID, "held maintenance Lease %s/%s as %s", lease.Namespace, lease.Name, holder)
	}
	return reconcile.Result{}, nil
}

// stillHeld reports whether the cached Lease shows nodeguard holding it,
// renewed recently. A held Lease is nobody else's to take, so every drain
// pass need not read it fresh; anything else is read fresh and acted on.
func (r *Reconciler) stillHeld(ctx context.Context, node *corev1.Node, holder string, now time.Time) bool {
	var lease coordinationv1.Lease
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	return err == nil && heldFresh(&lease, node, holder, now)
}

// heldFresh reports whether the Lease is the node's, held by holder and
// renewed within the last third of its duration.
func heldFresh(lease *coordinationv1.Lease, node *corev1.Node, holder string, now time.Time) bool {
	renewed := lease.Spec.RenewTime != nil && now.Sub(lease.Spec.RenewTime.Time) < maintenanceLeaseSeconds*time.Second/3
	return ptr.Deref(lease.Spec.HolderIdentity, "") == holder && renewed &&
		ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) > 0 && isOwnedBy(lease, node)
}

func (r *Reconciler) createLease(ctx context.Context, node *corev1.Node, now time.Time) error {
	holder := budget.HolderIdentity(r.Opts.Identity)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To[int32](maintenanceLeaseSeconds),
			AcquireTime:          ptr.To(metav1.NewMicroTime(now)),
			RenewTime:            ptr.To(metav1.NewMicroTime(now)),
		},
	}
	ownedByNode(lease, node)
	err := r.Client.Create(ctx, lease)
	if apierrors.IsNotFound(err) {
		// The install ships the namespace; nodeguard may not create namespaces.
		return fmt.Errorf("creating maintenance Lease: namespace %s does not exist: install it (it is part of manifests/default and of the Helm chart): %w",
			ngv1alpha1.MaintenanceLeaseNamespace, err)
	}
	if err != nil {
		return fmt.Errorf("creating maintenance Lease: %w", err)
	}
	r.progress(node.UID, "held maintenance Lease %s/%s as %s", lease.Namespace, lease.Name, holder)
	return nil
}

// releaseMaintenanceLease gives the Lease up if nodeguard holds it. The KEP
// says to set leaseDurationSeconds to 0, but kube-apiserver rejects that ("must
// be greater than 0"), so it clears the holder instead, as client-go's leader
// election does on release. The node is gone by then: failures are only logged,
// and the Lease lapses on its own.
func (r *Reconciler) releaseMaintenanceLease(ctx context.Context, node *corev1.Node) {
	var lease coordinationv1.Lease
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	if err != nil || !budget.IsNodeguardHolder(ptr.Deref(lease.Spec.HolderIdentity, "")) {
		return
	}
	lease.Spec.HolderIdentity = nil
	lease.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(r.Clock.Now()))
	err = r.Client.Update(ctx, &lease)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// The garbage collector deletes the Lease with its node: already gone.
	case err != nil:
		logf.FromContext(ctx).Error(err, "Releasing maintenance Lease", "lease", client.ObjectKeyFromObject(&lease))
	}
}

// ownedByNode makes the node the Lease's owner, so that the garbage collector
// deletes the Lease with the node: no maintenance Lease outlives its node.
func ownedByNode(lease *coordinationv1.Lease, node *corev1.Node) {
	if isOwnedBy(lease, node) {
		return
	}
	lease.OwnerReferences = append(lease.OwnerReferences, metav1.OwnerReference{
		APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
	})
}

func isOwnedBy(lease *coordinationv1.Lease, node *corev1.Node) bool {
	for _, o := range lease.OwnerReferences {
		if o.Kind == "Node" && o.UID == node.UID {
			return true
		}
	}
	return false
}
