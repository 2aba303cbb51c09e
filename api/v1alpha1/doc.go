// Package v1alpha1 holds the nodeguard.io/v1alpha1 API and what nodeguard
// knows of core objects, so that every door and controller reads them alike:
//
//   - nodedisruptionbudget_types.go: the NodeDisruptionBudget, with
//     groupversion_info.go its registration in a scheme and
//     zz_generated.deepcopy.go its generated copies;
//   - wellknown.go: the names nodeguard puts on or reads from core objects
//     (its finalizer, taints, annotations and marks, the maintenance Lease
//     namespace), which are API and never change;
//   - node.go: the rules about nodes that several parts of nodeguard apply,
//     each written once: the signal taints, a node ready, cordoned or
//     draining, a drain charged or shown, the time annotations, and the
//     drain mark's write.
//
// It imports only k8s.io/api and apimachinery, so that any package can use
// it.
//
// +kubebuilder:object:generate=true
// +groupName=nodeguard.io
package v1alpha1
