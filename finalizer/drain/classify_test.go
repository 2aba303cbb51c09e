package drain

import (
	"errors"
	"net/http"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
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
		{"blocked by a PDB", budgetRefusal(), ResultBlocked},
		// What client-go makes of priority and fairness's plain-text 429
		// once its own retries are spent: no cause.
		{"throttled", apierrors.NewGenericServerResponse(http.StatusTooManyRequests, "create", pods, "p", "Too many requests, please try again later.", 1, true), ResultThrottled},
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

// budgetRefusal is the Eviction API's 429 for a pod whose PDB allows no
// disruption, as kube-apiserver writes it (pkg/registry/core/pod/storage/eviction.go):
// the cause DisruptionBudget tells it from other 429s.
func budgetRefusal() error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget web needs 2 healthy pods and has 2 currently",
	})
	return err
}
