package webhook

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/autoscaler"
)

// The evictions that wait (429, which every drainer retries): those of a
// node deleted under nodeguard's finalizer, of a charged drain, or of a
// cluster-autoscaler scale-down, until the node's traffic is cut; those of a
// scale-down the hold has not charged yet, until it has (internal/autoscaler).

// TrafficGate is how evictions from a charged node wait for its traffic cut.
type TrafficGate struct {
	// Enabled when Azure is configured: nodeguard cuts the node's traffic.
	Enabled bool
	// Timeout (--admin-state-timeout) bounds the wait from the charge.
	Timeout time.Duration
	// Wait (--traffic-cut-failure=wait) waits past Timeout until the cut is
	// recorded.
	Wait bool
}

// deletingCutWait holds the evictions from a node deleted under nodeguard's
// finalizer until its traffic cut has ended, as nodeguard's own drain waits
// for it: Karpenter (or any drainer of a deleted node) evicts as soon as the
// node is deleted, while nodeguard is still setting its entries Down. The
// cached node may lag the termination controller's TrafficCut condition,
// which comes just before nodeguard's own evictions: a fresh read decides
// before a refusal. Once nodeguard's finalizer is gone the cut is over (or
// was not needed).
func (h *EvictionHandler) deletingCutWait(ctx context.Context, node *corev1.Node, req admission.Request) (decision, bool, error) {
	if !h.Traffic.Enabled || !ngv1alpha1.TerminatingUnderFinalizer(node) || h.cutOver(node) ||
		(h.Self != "" && req.UserInfo.Username == h.Self) {
		return decision{}, false, nil
	}
	var fresh corev1.Node
	if err := h.Reader.Get(ctx, client.ObjectKey{Name: node.Name}, &fresh); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return decision{}, false, nil
		}
		return decision{}, false, fmt.Errorf("reading node %s: %w", node.Name, err)
	}
	if !ngv1alpha1.TerminatingUnderFinalizer(&fresh) || h.cutOver(&fresh) {
		return decision{}, false, nil
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonTrafficCut, message: fmt.Sprintf(
		"evicting pod %s/%s: node %s is being deleted and its load-balancer traffic is being cut (AdminState Down) before its pods go; retry in a few seconds",
		req.Namespace, req.Name, node.Name)}, true, nil
}

// cutOver reports whether a deleted node's traffic cut has ended (the
// TrafficCut condition) or, unless the policy is wait, --admin-state-timeout
// has passed since its deletion.
func (h *EvictionHandler) cutOver(node *corev1.Node) bool {
	if _, ended := ngv1alpha1.TrafficCutEnded(node, h.Traffic.Wait); ended {
		return true
	}
	return !h.Traffic.Wait && !h.Clock.Now().Before(node.DeletionTimestamp.Add(h.Traffic.Timeout))
}

// awaitTrafficCut refuses evictions from a charged node ("retry") until its
// traffic cut has ended (the TrafficCut condition) or, unless the policy is
// wait, --admin-state-timeout after the charge.
func (h *EvictionHandler) awaitTrafficCut(node *corev1.Node, pod string) decision {
	if !h.Traffic.Enabled {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf("the drain of node %s is charged to its budgets", node.Name)}
	}
	if _, ended := ngv1alpha1.TrafficCutEnded(node, h.Traffic.Wait); ended {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf("the drain of node %s is charged and its traffic cut ended (condition %s)", node.Name, ngv1alpha1.TrafficCutCondition)}
	}
	chargedAt, ok := ngv1alpha1.AnnotationTime(node, ngv1alpha1.DrainChargedAtAnnotation)
	left := chargedAt.Add(h.Traffic.Timeout).Sub(h.Clock.Now())
	if ok && left <= 0 && !h.Traffic.Wait {
		return decision{allowed: true, reason: reasonCharged, message: fmt.Sprintf(
			"the drain of node %s is charged; Azure did not confirm its traffic cut within --admin-state-timeout (%s)", node.Name, h.Traffic.Timeout)}
	}
	return trafficCutWait(node, pod)
}

// scaleDownWait is the 429 for an eviction from a node whose scale-down is
// held (autoscaler.ScaleDownHeld): not yet charged to its budgets, or its
// traffic not yet cut.
func (h *EvictionHandler) scaleDownWait(node *corev1.Node, pod string) decision {
	if autoscaler.ScaleDownClaimed(node) {
		return trafficCutWait(node, pod)
	}
	return decision{code: http.StatusTooManyRequests, reason: reasonScaleDownUnclaimed, message: autoscaler.UnclaimedRefusal(node)}
}

// trafficCutWait is the 429 for an eviction from a node whose load-balancer
// traffic is being cut.
func trafficCutWait(node *corev1.Node, pod string) decision {
	return decision{code: http.StatusTooManyRequests, reason: reasonTrafficCut, message: fmt.Sprintf(
		"evicting pod %s: node %s's load-balancer traffic is being cut (AdminState Down) before its pods go; retry in a few seconds",
		pod, node.Name)}
}
