// Package requeue names the waits that nodeguard's controllers share.
package requeue

import "time"

// AfterConflict is how soon a pass runs again whose optimistic write (a node
// patch, a Lease update) lost to another writer (the kubelet, the taint
// watcher, an autoscaler): by then the informer has, as a rule, the write
// that won, so the next pass does not lose again on the same stale copy.
const AfterConflict = 100 * time.Millisecond
