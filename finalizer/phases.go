package finalizer

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/kube/nodepatch"
)

// cordon marks the node unschedulable and adds the draining taint, which
// counts the node unavailable for budgets and asks for AdminState Down. The
// patch is guarded by a test of the node's taints only (nodepatch): the taint
// watcher's and the kubelet's writes, which land as the deletion does, never
// make it fail. A changed taint list does: it reads the node again and
// retries at once, not after a turn in a queue a fleet's deletion keeps long.
func (r *Reconciler) cordon(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	for attempt := 1; ; attempt++ {
		if ngv1alpha1.Cordoned(node) && drainingTaint(node) != nil {
			return reconcile.Result{}, nil
		}
		err := r.patchCordon(ctx, node)
		if err == nil {
			r.progress(node.UID, "cordoned and tainted %s=%s:NoSchedule", ngv1alpha1.DrainingTaintKey, ngv1alpha1.DrainingTaintValue)
			return reconcile.Result{}, nil
		}
		if !apierrors.IsConflict(err) || attempt == cordonAttempts {
			return reconcile.Result{}, fmt.Errorf("cordoning: %w", err)
		}
		fresh, readErr := r.readNodeFresh(ctx, client.ObjectKeyFromObject(node))
		if readErr != nil {
			return reconcile.Result{}, fmt.Errorf("reading the node again to cordon it: %w", readErr)
		}
		if fresh.UID != node.UID || !ngv1alpha1.TerminatingUnderFinalizer(fresh) {
			return reconcile.Result{}, fmt.Errorf("cordoning: %w", err) // the next pass sees what happened
		}
		*node = *fresh
	}
}

// cordonAttempts bounds the cordon's tries within one pass.
const cordonAttempts = 3

func (r *Reconciler) patchCordon(ctx context.Context, node *corev1.Node) error {
	if drainingTaint(node) != nil {
		return nodepatch.Apply(ctx, r.Client, node, nodepatch.Add("/spec/unschedulable", true))
	}
	return nodepatch.Apply(ctx, r.Client, node, cordonPatch(node, corev1.Taint{
		Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue,
		Effect: corev1.TaintEffectNoSchedule, TimeAdded: ptr.To(metav1.NewTime(r.Clock.Now())),
	})...)
}

func drainingTaint(node *corev1.Node) *corev1.Taint {
	for i := range node.Spec.Taints {
		if node.Spec.Taints[i].Key == ngv1alpha1.DrainingTaintKey {
			return &node.Spec.Taints[i]
		}
	}
	return nil
}

// terminationStarted is when nodeguard cordoned the node, else its deletion,
// else (a drain nodeguard follows) when the drain was charged.
func terminationStarted(node *corev1.Node) time.Time {
	if t := drainingTaint(node); t != nil && t.TimeAdded != nil {
		return t.TimeAdded.Time
	}
	if node.DeletionTimestamp != nil {
		return node.DeletionTimestamp.Time
	}
	at, _ := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainChargedAtAnnotation)
	return at
}

// waitForVolumes waits, for at most VolumeDetachTimeout after the drain, until
// no VolumeAttachment refers to the node. VolumeAttachments come from the
// cache, and their changes wake the node (SetupWithManager): the requeue is
// the timeout.
func (r *Reconciler) waitForVolumes(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	if r.Opts.VolumeDetachTimeout <= 0 {
		return reconcile.Result{}, nil
	}
	var list storagev1.VolumeAttachmentList
	if err := r.Client.List(ctx, &list); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	var attached []string
	for _, va := range list.Items {
		if va.Spec.NodeName == node.Name {
			attached = append(attached, va.Name)
		}
	}
	if len(attached) == 0 {
		return reconcile.Result{}, nil
	}
	drainedAt, _ := r.drainEnded(node)
	left := drainedAt.Add(r.Opts.VolumeDetachTimeout).Sub(r.Clock.Now())
	if left < 0 {
		if r.once(node.UID, "volume-timeout") {
			r.event(node, corev1.EventTypeWarning, ReasonVolumeDetachTimedOut,
				"%d volume attachment(s) still present after %s, releasing anyway: %v", len(attached), r.Opts.VolumeDetachTimeout, attached)
		}
		return reconcile.Result{}, nil
	}
	r.waitFor(node.UID, "waiting for %d VolumeAttachment(s) to go: %v; releasing anyway in %s (--volume-detach-timeout)",
		len(attached), attached, left.Round(time.Second))
	if r.once(node.UID, "volume-wait") {
		r.event(node, corev1.EventTypeNormal, ReasonWaitingForVolumeDetach, "waiting for %d volume attachment(s) to go: %v", len(attached), attached)
	}
	return reconcile.Result{RequeueAfter: left + time.Millisecond}, nil
}

// release removes only nodeguard's finalizer (a JSON patch that tests it is
// still where it was read), which lets the API server delete the node, gives
// up the maintenance Lease, and says so with the steps taken.
func (r *Reconciler) release(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	return r.releaseSaying(ctx, node, ReasonReleased, "released the node")
}

// releaseSaying is release with the event's reason and first words. The
// event is a Warning when it is the first to name evicted pods a user may
// regret (losses.go).
func (r *Reconciler) releaseSaying(ctx context.Context, node *corev1.Node, reason, what string) (reconcile.Result, error) {
	note, losses := r.releaseNote(node, what), r.takeLosses(node.UID)
	result, err := r.removeFinalizer(ctx, node)
	switch {
	case err != nil:
		r.restoreLosses(node.UID, losses) // said by the next try
	case losses.empty():
		r.event(node, corev1.EventTypeNormal, reason, "%s", note)
	default:
		r.event(node, corev1.EventTypeWarning, reason, "%s; %s", note, losses.note())
	}
	return result, err
}

// removeFinalizer is release without its event.
func (r *Reconciler) removeFinalizer(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	// A node that another finalizer keeps shows how its drain ended: what
	// is staged is written first. One that goes with the finalizer is not
	// written again: its status goes with it.
	if r.keptByOthers(node) {
		r.removeCondition(node)
		if err := r.flushConditionsNow(ctx, node); err != nil {
			return reconcile.Result{}, err
		}
	} else {
		r.dropStaged(node.UID)
	}
	if i := slices.Index(node.Finalizers, ngv1alpha1.TerminationFinalizer); i >= 0 {
		if err := nodepatch.Apply(ctx, r.Client, node, finalizerRemoval(i)...); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, fmt.Errorf("removing finalizer: %w", err)
		}
	}
	r.releaseMaintenanceLease(ctx, node)
	terminationDuration.Observe(r.Clock.Since(node.DeletionTimestamp.Time).Seconds())
	return reconcile.Result{}, nil
}
