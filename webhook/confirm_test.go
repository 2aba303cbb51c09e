package webhook_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// TestUnconfirmedDrainIsRenewedByItsRetries: the eviction that charges a drain
// names its pod on the node (what the termination controller confirms the
// charge by), and while the charge is unconfirmed, the drainer's retries
// (here behind the traffic cut's 429) renew it at most every 5 s; once
// confirmed, retries write nothing.
func TestUnconfirmedDrainIsRenewedByItsRetries(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	node := createReadyNodes(t, "renew", 2)[0]
	createBudget(t, "renew", 1, builder.NDBMaxUnavailable("1"))
	pod := createPod(t, "renew-a", node)
	cordon(t, node)
	h := evictionHandler(t, ngwebhook.TrafficGate{Enabled: true, Timeout: time.Hour})
	clk := clocktesting.NewFakeClock(time.Now())
	h.Clock = clk
	ctx := context.Background()
	retry := func() {
		t.Helper()
		if resp := h.Handle(ctx, evictionReview(pod.Namespace, pod.Name, nil)); resp.Allowed || resp.Result.Code != http.StatusTooManyRequests {
			t.Fatalf("eviction before the traffic cut: want 429, got allowed=%v %+v", resp.Allowed, resp.Result)
		}
	}
	askedAt := func() string {
		t.Helper()
		return getNode(t, node).Annotations[ngv1alpha1.DrainAskedAtAnnotation]
	}

	retry()
	marked := getNode(t, node)
	if got := marked.Annotations[ngv1alpha1.DrainFirstEvictionAnnotation]; got != pod.Namespace+"/"+pod.Name {
		t.Fatalf("%s = %q, want the charging eviction's pod %s/%s", ngv1alpha1.DrainFirstEvictionAnnotation, got, pod.Namespace, pod.Name)
	}
	if !ngv1alpha1.DrainUnconfirmed(marked) {
		t.Fatalf("a fresh charge reads as confirmed: %v", marked.Annotations)
	}
	retry()
	if got := askedAt(); got != "" {
		t.Errorf("a retry within 5 s of the charge wrote %s=%s", ngv1alpha1.DrainAskedAtAnnotation, got)
	}

	clk.Step(6 * time.Second)
	retry()
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		return askedAt() == ngv1alpha1.FormatTime(clk.Now()), nil
	}, "a retry 6 s after the charge renews it")

	patchNode(t, node, func(n *corev1.Node) {
		n.Annotations[ngv1alpha1.DrainConfirmedAtAnnotation] = ngv1alpha1.FormatTime(clk.Now())
	})
	before := askedAt()
	clk.Step(6 * time.Second)
	harness.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
		return err == nil && !ngv1alpha1.DrainUnconfirmed(&n), err
	}, "the cache shows the confirmation")
	retry()
	if got := askedAt(); got != before {
		t.Errorf("a retry of a confirmed drain renewed it: %s=%s, was %s", ngv1alpha1.DrainAskedAtAnnotation, got, before)
	}
}
