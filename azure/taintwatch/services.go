package taintwatch

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/nodeguard/nodeguard/azure"
)

// serviceWatcher tells the admin-state manager when a LoadBalancer Service
// changes: cloud-provider-azure then reconciles the load balancer and may
// write its backend pools from a copy read before a traffic cut, so the
// manager verifies its held-down entries soon after.
type serviceWatcher struct {
	adminState *azure.Manager
}

// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch

func (s *serviceWatcher) setup(mgr ctrl.Manager) error {
	err := ctrl.NewControllerManagedBy(mgr).
		Named("loadbalancer-service-watcher").
		For(&corev1.Service{}, builder.WithPredicates(loadBalancerServices())).
		Complete(s)
	if err != nil {
		return fmt.Errorf("setting up the LoadBalancer Service watcher: %w", err)
	}
	return nil
}

// loadBalancerServices passes changes of Services that are, or were, of
// type LoadBalancer.
func loadBalancerServices() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return isLoadBalancer(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return isLoadBalancer(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return isLoadBalancer(e.ObjectOld) || isLoadBalancer(e.ObjectNew) },
		GenericFunc: func(e event.GenericEvent) bool { return isLoadBalancer(e.Object) },
	}
}

func isLoadBalancer(o client.Object) bool {
	svc, ok := o.(*corev1.Service)
	return ok && svc.Spec.Type == corev1.ServiceTypeLoadBalancer
}

func (s *serviceWatcher) Reconcile(context.Context, reconcile.Request) (reconcile.Result, error) {
	s.adminState.ClusterChanged()
	return reconcile.Result{}, nil
}
