package finalizer

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// InstanceChecker says whether a node's cloud instance still exists (the
// Azure admin-state manager asks ARM for the node's VM): the budget rule's.
type InstanceChecker = budget.InstanceChecker

// instanceGone reports whether a terminating node is not Ready and its VM no
// longer exists (the cloud node lifecycle controller's case, or a VM deleted
// under a drain): no kubelet will finish its pods and there is no traffic to
// cut. A Ready node is not asked about; an error counts as "exists".
func (r *Reconciler) instanceGone(ctx context.Context, node *corev1.Node) bool {
	if r.Instances == nil || ngv1alpha1.Ready(node) {
		return false
	}
	exists, err := r.Instances.InstanceExists(ctx, node)
	if err != nil {
		logf.FromContext(ctx).Error(err, "Asking whether the node's VM exists; terminating it as usual", "node", node.Name)
		return false
	}
	return !exists
}

// releaseGone lets a node whose VM is gone go at once: no Lease, no cordon,
// no traffic cut, no drain. The pod garbage collector deletes its pods once
// the node is gone.
func (r *Reconciler) releaseGone(ctx context.Context, node *corev1.Node) (reconcile.Result, error) {
	r.reportLosses(node, true) // a drain cut short by the VM's end said nothing yet
	r.event(node, corev1.EventTypeNormal, ReasonInstanceGone,
		"the node is not Ready and its VM %s no longer exists: releasing it at once, without a drain; the pod garbage collector removes its pods", node.Spec.ProviderID)
	return r.removeFinalizer(ctx, node)
}

// DefaultInstanceCacheTTL is how long the termination trusts an answer that a
// NotReady node's VM still exists before it asks ARM again.
const DefaultInstanceCacheTTL = 5 * time.Second

// CachedInstances remembers, for TTL, that a node's VM exists: the
// termination asks on every pass of a NotReady node (each drain poll), and one
// VM GET per node per TTL is enough. "Gone" is never cached (the node is
// released at once), nor are errors.
type CachedInstances struct {
	Checker InstanceChecker
	TTL     time.Duration
	Clock   clock.PassiveClock

	mu sync.Mutex
	// exists: when ARM last said the VM exists, by node UID and providerID.
	exists map[instanceKey]time.Time
}

type instanceKey struct {
	uid        types.UID
	providerID string
}

// InstanceExists implements InstanceChecker.
func (c *CachedInstances) InstanceExists(ctx context.Context, node *corev1.Node) (bool, error) {
	key := instanceKey{node.UID, node.Spec.ProviderID}
	now := c.Clock.Now()
	c.mu.Lock()
	for k, at := range c.exists {
		if now.Sub(at) >= c.TTL {
			delete(c.exists, k)
		}
	}
	_, fresh := c.exists[key]
	c.mu.Unlock()
	if fresh {
		return true, nil
	}
	exists, err := c.Checker.InstanceExists(ctx, node)
	if err != nil || !exists {
		return exists, err
	}
	c.mu.Lock()
	if c.exists == nil {
		c.exists = map[instanceKey]time.Time{}
	}
	c.exists[key] = now
	c.mu.Unlock()
	return true, nil
}
