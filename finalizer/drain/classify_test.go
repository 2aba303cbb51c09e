package drain

import (
	"errors"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestClassifyEvictionAnswers(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	status := func(code int32, msg string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Message: msg}}
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"evicted", nil, ResultEvicted},
		{"gone", apierrors.NewNotFound(pods, "p"), ResultGone},
		{"replaced (UID precondition)", apierrors.NewConflict(pods, "p", errors.New("uid")), ResultGone},
		{"blocked by a PDB", apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0), ResultBlocked},
		// The API server's own words (pkg/registry/core/pod/storage/eviction.go).
		{"more than one PDB", status(http.StatusInternalServerError, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."), ResultMultiplePDBs},
		{"another server error", status(http.StatusInternalServerError, "etcdserver: request timed out"), ResultError},
		{"unavailable", status(http.StatusServiceUnavailable, "try later"), ResultError},
	}
	for _, tt := range tests {
		if got := classify(tt.err); got != tt.want {
			t.Errorf("%s: classify = %s, want %s", tt.name, got, tt.want)
		}
	}
}
