// Package requeue names the waits that nodeguard's controllers share, and
// reads a lost optimistic write the one way they all do.
package requeue

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AfterConflict is how soon a pass runs again whose optimistic write (a node
// patch, a Lease update) lost to another writer (the kubelet, the taint
// watcher, an autoscaler): by then the informer has, as a rule, the write
// that won, so the next pass does not lose again on the same stale copy.
const AfterConflict = 100 * time.Millisecond

// OnConflict reports whether err is a write that lost to another writer (a
// conflict), and the result that looks again after AfterConflict: no
// failure, the next pass reads what won.
func OnConflict(err error) (reconcile.Result, bool) {
	if !apierrors.IsConflict(err) {
		return reconcile.Result{}, false
	}
	return reconcile.Result{RequeueAfter: AfterConflict}, true
}
