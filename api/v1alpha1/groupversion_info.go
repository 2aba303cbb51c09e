// Package v1alpha1 holds the nodeguard.io/v1alpha1 API (NodeDisruptionBudget)
// and the well-known names nodeguard puts on core objects. It imports only
// apimachinery, so that any package can use it.
//
// +kubebuilder:object:generate=true
// +groupName=nodeguard.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "nodeguard.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &NodeDisruptionBudget{}, &NodeDisruptionBudgetList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
