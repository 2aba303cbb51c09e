// Package v1alpha1 holds the nodeguard.io/v1alpha1 API: NodeDisruptionBudget.
//
// +kubebuilder:object:generate=true
// +groupName=nodeguard.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "nodeguard.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
