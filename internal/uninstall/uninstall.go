// Package uninstall removes nodeguard from a cluster without leaving nodes that
// cannot be deleted: webhooks first, then the drains in progress are let finish,
// then nodeguard is stopped, the bindings of the admission policies that guard
// its finalizer are deleted, and its finalizer, taint and annotations are
// removed. Last, it warns of the load-balancer entries nodeguard set Down
// that nobody will restore.
//
// This file runs the steps; nodes.go writes a node (retried on conflicts,
// and while a deleted policy binding still refuses); command.go is
// `nodeguard uninstall` and options.go its flags.
package uninstall

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
)

// Run carries out the uninstall against the cluster c, reporting each step on out.
func Run(ctx context.Context, c client.Client, o Options, out io.Writer) error {
	if o.Poll == 0 {
		o.Poll = 2 * time.Second
	}
	if o.PolicyWait == 0 {
		o.PolicyWait = time.Minute
	}
	return (&uninstaller{c: c, o: o, out: out}).run(ctx)
}

// uninstaller carries out the steps of `nodeguard uninstall`.
type uninstaller struct {
	c   client.Client
	o   Options
	out io.Writer
}

func (u *uninstaller) say(format string, args ...any) { fmt.Fprintf(u.out, format+"\n", args...) }

func (u *uninstaller) run(ctx context.Context) error {
	u.say("1/7 webhook configurations")
	if err := u.deleteWebhooks(ctx); err != nil {
		return err
	}
	running, err := u.nodeguardRunning(ctx)
	if err != nil {
		return err
	}
	u.say("2/7 drains in progress")
	if err := u.waitForDrains(ctx, running); err != nil {
		return err
	}
	u.say("3/7 stopping nodeguard")
	if err := u.stopNodeguard(ctx); err != nil {
		return err
	}
	u.say("4/7 admission policy bindings")
	if err := u.deletePolicyBindings(ctx); err != nil {
		return err
	}
	u.say("5/7 nodes not being deleted")
	if err := u.cleanIdleNodes(ctx); err != nil {
		return err
	}
	u.say("6/7 nodes still being deleted")
	if err := u.releaseDeleting(ctx); err != nil {
		return err
	}
	u.say("7/7 load-balancer entries nodeguard set Down for nodes that are gone")
	if err := u.reportRecordedDowns(ctx); err != nil {
		return err
	}
	u.say("done: no node carries %s", ngv1alpha1.TerminationFinalizer)
	return nil
}

// deleteWebhooks deletes nodeguard's two webhook configurations, by name and
// nothing else: a configuration of another name is someone else's, even if
// it calls a nodeguard webhook (the uninstall hook may delete only these two).
func (u *uninstaller) deleteWebhooks(ctx context.Context) error {
	deleted := 0
	for _, obj := range []client.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: u.o.Mutating}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: u.o.Validating}},
	} {
		kind := "MutatingWebhookConfiguration"
		if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
			kind = "ValidatingWebhookConfiguration"
		}
		err := u.c.Delete(ctx, obj)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("deleting %s %s: %w", kind, obj.GetName(), err)
		}
		deleted++
		u.say("   deleted %s %s", kind, obj.GetName())
	}
	if deleted == 0 {
		u.say("   none found (already removed)")
	}
	return nil
}

// deletePolicyBindings deletes nodeguard's ValidatingAdmissionPolicyBindings,
// by name and nothing else. They bind cluster-admins too, so that removing
// the finalizer (steps 5 and 6) would be refused with them in place; with
// nodeguard stopped, nothing needs them any more. Their policies go with
// kubectl delete -k or helm uninstall.
func (u *uninstaller) deletePolicyBindings(ctx context.Context) error {
	deleted := 0
	for _, name := range u.o.PolicyBindings {
		err := u.c.Delete(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("deleting ValidatingAdmissionPolicyBinding %s: %w", name, err)
		}
		deleted++
		u.say("   deleted ValidatingAdmissionPolicyBinding %s", name)
	}
	if deleted == 0 {
		u.say("   none found")
	}
	return nil
}

// refusedByPolicyBinding tells whether err is a denial by one of nodeguard's
// policy bindings, which the API server still enforces for a moment after
// their deletion.
func (u *uninstaller) refusedByPolicyBinding(err error) bool {
	if err == nil {
		return false
	}
	for _, name := range u.o.PolicyBindings {
		if strings.Contains(err.Error(), "ValidatingAdmissionPolicy") && strings.Contains(err.Error(), "binding '"+name+"'") {
			return true
		}
	}
	return false
}

// nodeguardRunning reports whether nodeguard's Deployment has a ready replica
// to finish drains.
func (u *uninstaller) nodeguardRunning(ctx context.Context) (bool, error) {
	if u.o.Deployment == "" {
		return true, nil // run elsewhere: assume it is, and let --drain-wait bound the wait
	}
	var d appsv1.Deployment
	err := u.c.Get(ctx, types.NamespacedName{Namespace: u.o.Namespace, Name: u.o.Deployment}, &d)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading Deployment %s/%s: %w", u.o.Namespace, u.o.Deployment, err)
	}
	return d.Status.ReadyReplicas > 0, nil
}

// deletingNodes returns the nodes being deleted under nodeguard's finalizer:
// the drains in progress.
func (u *uninstaller) deletingNodes(ctx context.Context) ([]string, error) {
	var nodes corev1.NodeList
	if err := u.c.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var names []string
	for _, n := range nodes.Items {
		if ngv1alpha1.TerminatingUnderFinalizer(&n) {
			names = append(names, n.Name)
		}
	}
	return names, nil
}

func (u *uninstaller) waitForDrains(ctx context.Context, running bool) error {
	pending, err := u.deletingNodes(ctx)
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		u.say("   none")
		return nil
	}
	u.say("   %d node(s) deleting under the finalizer: %s", len(pending), strings.Join(pending, ", "))
	if !running {
		u.say("   nodeguard is not running (no ready replica of Deployment %s/%s): nothing will finish them; they are released in step 5", u.o.Namespace, u.o.Deployment)
		return nil
	}
	if u.o.DrainWait <= 0 {
		u.say("   --drain-wait is 0: not waiting; they are released in step 5")
		return nil
	}
	u.say("   waiting up to %s for nodeguard to finish them", u.o.DrainWait)
	deadline := time.Now().Add(u.o.DrainWait)
	for {
		left, err := u.deletingNodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range pending {
			if !slices.Contains(left, n) {
				u.say("   drained and released: %s", n)
			}
		}
		pending = left
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			u.say("   still deleting after %s: %s", u.o.DrainWait, strings.Join(pending, ", "))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(u.o.Poll):
		}
	}
}

// stopNodeguard scales the Deployment to 0 and waits for its pods to go.
// A running nodeguard would put the finalizer back on every node.
func (u *uninstaller) stopNodeguard(ctx context.Context) error {
	if u.o.Deployment == "" {
		u.say("   --deployment is empty: make sure nodeguard is stopped, or it puts the finalizer back")
		return nil
	}
	key := types.NamespacedName{Namespace: u.o.Namespace, Name: u.o.Deployment}
	var d appsv1.Deployment
	if err := u.c.Get(ctx, key, &d); apierrors.IsNotFound(err) {
		u.say("   Deployment %s not found: if nodeguard runs elsewhere, stop it, or it puts the finalizer back", key)
		return nil
	} else if err != nil {
		return fmt.Errorf("reading Deployment %s: %w", key, err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		patch := client.MergeFrom(d.DeepCopy())
		zero := int32(0)
		d.Spec.Replicas = &zero
		if err := u.c.Patch(ctx, &d, patch); err != nil {
			return fmt.Errorf("scaling Deployment %s to 0: %w", key, err)
		}
		u.say("   scaled Deployment %s to 0", key)
	}
	selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return fmt.Errorf("Deployment %s selector: %w", key, err)
	}
	deadline := time.Now().Add(u.o.StopWait)
	for {
		var pods corev1.PodList
		if err := u.c.List(ctx, &pods, client.InNamespace(u.o.Namespace), client.MatchingLabelsSelector{Selector: selector}); err != nil {
			return fmt.Errorf("listing nodeguard pods: %w", err)
		}
		if len(pods.Items) == 0 {
			u.say("   no nodeguard pod is left")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d nodeguard pod(s) still exist after %s; stop them and run uninstall again", len(pods.Items), u.o.StopWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(u.o.Poll):
		}
	}
}

// bookkeepingAnnotations are nodeguard's marks that mean nothing without it.
// AdminStateDownAnnotation is not among them: it records that Azure entries
// may still be Down, which the operator needs to know.
var bookkeepingAnnotations = []string{
	ngv1alpha1.FinalizerAddedAtAnnotation,
	ngv1alpha1.TrafficCutAtAnnotation,
	ngv1alpha1.DrainedAtAnnotation,
	ngv1alpha1.SpotEventHandledAnnotation,
	// Without nodeguard, its hold would delay every cluster-autoscaler
	// scale-down by --node-deletion-delay-timeout.
	ngv1alpha1.DelayDeletionAnnotation,
	ngv1alpha1.ScaleDownClaimedAnnotation,
	ngv1alpha1.DrainChargedAtAnnotation,
	ngv1alpha1.DrainedByAnnotation,
	ngv1alpha1.DrainFirstEvictionAnnotation,
	ngv1alpha1.DrainAskedAtAnnotation,
	ngv1alpha1.DrainConfirmedAtAnnotation,
	ngv1alpha1.DrainConditionAnnotation,
}

// cleanIdleNodes removes the finalizer, the draining taint and the
// bookkeeping annotations from every node that is not being deleted. It does
// not uncordon: a cordon may be someone else's.
func (u *uninstaller) cleanIdleNodes(ctx context.Context) error {
	var nodes corev1.NodeList
	if err := u.c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	cleaned := 0
	for _, n := range nodes.Items {
		if n.DeletionTimestamp != nil {
			continue
		}
		changed, err := u.updateNode(ctx, n.Name, func(node *corev1.Node) []string {
			if node.DeletionTimestamp != nil {
				return nil // deleting since the list: step 5 handles it
			}
			var did []string
			if removeFinalizer(node) {
				did = append(did, "finalizer")
			}
			if i := slices.IndexFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.DrainingTaintKey }); i >= 0 {
				node.Spec.Taints = slices.Delete(node.Spec.Taints, i, i+1)
				did = append(did, "taint "+ngv1alpha1.DrainingTaintKey)
			}
			for _, a := range bookkeepingAnnotations {
				if _, ok := node.Annotations[a]; ok {
					delete(node.Annotations, a)
					did = append(did, "annotation "+a)
				}
			}
			if _, ours := node.Annotations[ngv1alpha1.ScaleDownDisabledByAnnotation]; ours {
				delete(node.Annotations, ngv1alpha1.ScaleDownDisabledByAnnotation)
				delete(node.Annotations, ngv1alpha1.ScaleDownDisabledAnnotation)
				did = append(did, "annotation "+ngv1alpha1.ScaleDownDisabledAnnotation)
			}
			return did
		})
		if err != nil {
			return err
		}
		if len(changed) > 0 {
			cleaned++
			u.say("   %s: removed %s", n.Name, strings.Join(changed, ", "))
		}
		if _, ok := n.Annotations[ngv1alpha1.AdminStateDownAnnotation]; ok {
			u.say("   %s: WARNING nodeguard set its load-balancer entries Down (annotation %s) and will no longer restore None; "+
				"once the node is healthy, set AdminState None on its backend pool entries yourself", n.Name, ngv1alpha1.AdminStateDownAnnotation)
		}
	}
	u.say("   %d of %d node(s) cleaned", cleaned, len(nodes.Items))
	return nil
}

// releaseDeleting removes the finalizer from the nodes still being deleted.
func (u *uninstaller) releaseDeleting(ctx context.Context) error {
	left, err := u.deletingNodes(ctx)
	if err != nil {
		return err
	}
	if len(left) == 0 {
		u.say("   none")
		return nil
	}
	for _, name := range left {
		if _, err := u.updateNode(ctx, name, func(node *corev1.Node) []string {
			if removeFinalizer(node) {
				return []string{"finalizer"}
			}
			return nil
		}); err != nil {
			return err
		}
		u.say("   %s: released WITHOUT a complete drain (pods still on it go with the node)", name)
	}
	return nil
}

// reportRecordedDowns warns about every load-balancer entry nodeguard set
// Down for a node that no longer exists (a node that exists was warned about
// by its annotation in step 4).
func (u *uninstaller) reportRecordedDowns(ctx context.Context) error {
	downs, err := azure.ListRecordedDowns(ctx, u.c, ngv1alpha1.MaintenanceLeaseNamespace)
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		u.say("   cannot read the records in %s (%v): check the load balancers' entries yourself", ngv1alpha1.MaintenanceLeaseNamespace, err)
		return nil
	}
	if err != nil {
		return err
	}
	var nodes corev1.NodeList
	if err := u.c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	exists := map[types.UID]bool{}
	for _, n := range nodes.Items {
		exists[n.UID] = true
	}
	warned := 0
	for _, d := range downs {
		if exists[d.UID] {
			continue
		}
		warned++
		u.say("   WARNING backend pool %s, entry %s: nodeguard set it Down for node %s, which is gone, and will no longer restore None; "+
			"set AdminState None on it yourself if its address serves again (a reinstalled nodeguard restores it)", d.Pool, d.Entry, d.Node)
	}
	if warned == 0 {
		u.say("   none")
	}
	return nil
}
