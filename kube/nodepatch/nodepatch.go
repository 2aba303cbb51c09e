// Package nodepatch writes nodes with JSON patches whose test operations
// guard exactly the fields they replace. Unlike an optimistic lock on the
// whole node, the kubelet's status writes and other controllers' annotations
// never make such a patch fail; a change of a tested field does, and comes
// back as a Conflict, for the caller to read the node again. Every write of
// a node goes to every watcher of nodes, so a write that fails for nothing
// is a cost a fleet's deletion pays many times.
package nodepatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Op is one operation of an RFC 6902 JSON patch.
type Op struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	// Value is written even when nil: a test of null passes on a field
	// that is absent, as kube-apiserver's JSON patch does it.
	Value any `json:"value"`
}

// Test passes while the value at path is value (nil: the field is absent).
func Test(path string, value any) Op { return Op{Op: "test", Path: path, Value: value} }

// Add sets the value at path (replacing a member that is there).
func Add(path string, value any) Op { return Op{Op: "add", Path: path, Value: value} }

// Remove removes the value at path; it fails when there is none.
func Remove(path string) Op { return Op{Op: "remove", Path: path} }

// AnnotationPath is the JSON pointer of an annotation (RFC 6901: "~" and "/"
// escaped).
func AnnotationPath(key string) string {
	return "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

// Apply sends the patch and updates node with the answer. A failed test
// comes back as a Conflict.
func Apply(ctx context.Context, c client.Client, node *corev1.Node, ops ...Op) error {
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	err = c.Patch(ctx, node, client.RawPatch(types.JSONPatchType, data))
	if testFailed(err) {
		return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, node.Name, fmt.Errorf("the node changed: %w", err))
	}
	return err
}

// testFailed reports whether kube-apiserver could not apply a JSON patch to
// the node as it stands: a 422 naming no field (a failed validation names
// its fields; a failed test, or a removal of what is no longer there, names
// nothing).
func testFailed(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) {
		return false
	}
	details := status.Status().Details
	return details == nil || len(details.Causes) == 0
}
