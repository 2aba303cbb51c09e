package drain

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestDeferredQueueTakesTheLatestPlan: while another queue evicts under PDB
// web, node b's passes come again and again (each status of a PDB with a
// long queue wakes every node with a pod under it). One queue of node b
// waits for the PDB, not one per pass, and it evicts what node b's latest
// pass planned: web-b1, gone meanwhile, is not sent.
func TestDeferredQueueTakesTheLatestPlan(t *testing.T) {
	api := &evictionAPI{}
	e := &Evictor{Client: api.client()}
	pdb := webPDB(2)
	b1, b2 := pod("web-b1", "web", ready), pod("web-b2", "web", ready)

	lock := e.lockFor(pdb.UID) // another queue evicts under the PDB
	lock.Lock()
	before := runtime.NumGoroutine()
	for range 50 {
		if out := e.Evict(context.Background(), "b", queuePlan(pdb, &b1, &b2)); out.Deferred != 1 {
			lock.Unlock()
			t.Fatalf("pass %+v, want its queue deferred", out)
		}
	}
	e.Evict(context.Background(), "b", queuePlan(pdb, &b2)) // web-b1 went
	// A goroutine started by go is counted at once, running or not.
	if extra := runtime.NumGoroutine() - before; extra > 2 {
		t.Errorf("51 passes deferred behind the PDB left %d more goroutines, want the one queue waiting", extra)
	}
	lock.Unlock()
	api.waitFor(t, 1)
	deadline := time.Now().Add(10 * time.Second)
	for e.Busy(pdb.UID) { // the queue lets go of the lock at its end
		if time.Now().After(deadline) {
			t.Fatalf("evictions %v: the deferred queue did not run to its end once the PDB's lock was free", api.log())
		}
		time.Sleep(time.Millisecond)
	}
	if got := api.log(); !slices.Equal(got, []string{"web-b2 200"}) {
		t.Errorf("evictions %v, want web-b2's alone: the latest pass's plan", got)
	}
}

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
