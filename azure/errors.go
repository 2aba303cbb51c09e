package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

// Errors WaitConfirmed returns besides a context's.
var (
	// ErrNotTracked: SetDesired was never called for the node.
	ErrNotTracked = errors.New("node admin state is not tracked")
	// ErrForgotten: the node was forgotten (deleted) while waiting.
	ErrForgotten = errors.New("node was forgotten while waiting for its admin state")
	// ErrStopped: the manager stopped.
	ErrStopped = errors.New("admin-state manager stopped")
)

// UpdateFailedError is a node's admin state that could not be applied to a
// backend pool: a terminal error, or retries exhausted.
type UpdateFailedError struct {
	Pool    string
	Retries int
	Err     error
}

func (e *UpdateFailedError) Error() string {
	if e.Retries > 0 {
		return fmt.Sprintf("updating backend pool %s failed after %d retries: %s", e.Pool, e.Retries, armclient.Summary(e.Err))
	}
	return fmt.Sprintf("updating backend pool %s failed: %s", e.Pool, armclient.Summary(e.Err))
}

func (e *UpdateFailedError) Unwrap() error { return e.Err }

// NoEntryError is a node that is a member of a NIC-based backend pool only
// through its NIC's IP configuration (the pool's backendIPConfigurations):
// the pool has no backend-address entry to carry an admin state, and ARM does
// not let a client add one (networkInterfaceIPConfiguration is read-only), so
// the node's traffic through this pool is not cut.
type NoEntryError struct{ Pool string }

func (e *NoEntryError) Error() string {
	return "backend pool " + e.Pool + " lists the node only in backendIPConfigurations: it has no backend-address entry to carry an admin state"
}

// RecordError is a failure to save the record of the entries nodeguard sets
// Down. No Down is written unrecorded, so the write waits for a retry.
type RecordError struct {
	Pool string
	Err  error
}

func (e *RecordError) Error() string {
	return "recording the entries set Down in backend pool " + e.Pool + " (Lease in the maintenance namespace): " + e.Err.Error()
}

func (e *RecordError) Unwrap() error { return e.Err }

// errorClass is what the manager does about an error.
type errorClass int

const (
	// classStale: the pool is gone (404): drop quietly.
	classStale errorClass = iota
	// classThrottled: 429 for the subscription's request budget: park the
	// pool until RetryAfter, then retry.
	classThrottled
	// classBusy: 429 RetryableError, another operation is updating the load
	// balancer: park the pool until RetryAfter, spending no retry; ARM asks
	// to come back, for as long as the desired state stands.
	classBusy
	// classReread: 412, someone wrote since the Get: re-read and re-apply,
	// spending no retry.
	classReread
	// classRetriable: 409, a canceled long-running write: retry after a fresh Get.
	classRetriable
	// classTerminal: everything else, including statuses the SDK already retried.
	classTerminal
	// classShutdown: the manager is stopping: drop with no event.
	classShutdown
)

// errorCodeCanceled is the ErrorCode of a long-running operation that ARM
// canceled, typically because a newer write to the same resource superseded it.
const errorCodeCanceled = "Canceled"

// classify sorts an error from a pool's Get or CreateOrUpdate. retryAfter is
// set for throttling.
func classify(ctx context.Context, err error) (class errorClass, retryAfter time.Time) {
	if ctx.Err() != nil {
		return classShutdown, time.Time{}
	}
	var rerr *RecordError
	if errors.As(err, &rerr) {
		// The API server, not ARM: nothing was written; try again soon.
		return classRetriable, time.Time{}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// ARM did not answer within --azure-request-timeout (each try within
		// its part of it): a hang passes, so try again soon.
		return classRetriable, time.Time{}
	}
	var te *armclient.ThrottleError
	if errors.As(err, &te) {
		if te.ResourceBusy {
			return classBusy, te.RetryAfter
		}
		return classThrottled, te.RetryAfter
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusNotFound:
			return classStale, time.Time{}
		case re.StatusCode == http.StatusPreconditionFailed:
			return classReread, time.Time{}
		case re.StatusCode == http.StatusConflict:
			return classRetriable, time.Time{}
		case re.StatusCode == http.StatusOK && re.ErrorCode == errorCodeCanceled:
			// A long-running write that failed reports 200 with the
			// operation's error code.
			return classRetriable, time.Time{}
		}
	}
	// 408/500/502/503/504 were already retried by the SDK; the rest cannot
	// succeed by repeating.
	return classTerminal, time.Time{}
}
