package webhook_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

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

// TestEvictionsFromADeletedNodeWaitForItsTrafficCut: Karpenter (or anyone)
// evicts the pods of a node deleted under nodeguard's finalizer at once;
// with Azure, those evictions are refused with 429 until the node's traffic
// cut has ended (its TrafficCut condition), as nodeguard's own drain waits,
// or --admin-state-timeout after the deletion. nodeguard's own evictions are
// not held: its drain begins after its cut.
func TestEvictionsFromADeletedNodeWaitForItsTrafficCut(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	nodes := createReadyNodes(t, "delcut", 2)
	releaseOnCleanup(t, nodes...)
	createBudget(t, "delcut", 1, builder.NDBMaxUnavailable("1"))
	pod := createPod(t, "delcut-a", nodes[0])
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", nodes[0], "--wait=false"); err != nil {
		t.Fatalf("kubectl delete node %s: %v\n%s", nodes[0], err, out)
	}
	wantDeleting(t, nodes[0])
	h := evictionHandler(t, ngwebhook.TrafficGate{Enabled: true, Timeout: time.Hour})
	h.Self = "system:serviceaccount:nodeguard-system:nodeguard"
	ctx := context.Background()
	as := func(user string) admission.Request {
		req := evictionReview(pod.Namespace, pod.Name, nil)
		req.UserInfo.Username = user
		return req
	}

	resp := h.Handle(ctx, as("system:serviceaccount:kube-system:karpenter"))
	if resp.Allowed || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "being deleted") {
		t.Fatalf("Karpenter's eviction before the cut: want 429, got allowed=%v %+v", resp.Allowed, resp.Result)
	}
	if resp := h.Handle(ctx, as(h.Self)); !resp.Allowed {
		t.Fatalf("nodeguard's own eviction was held: %+v", resp.Result)
	}

	patchNodeStatus(t, nodes[0], func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: ngv1alpha1.TrafficCutCondition, Status: corev1.ConditionTrue, Reason: "AdminStateDown",
			LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now(),
		})
	})
	if resp := h.Handle(ctx, as("system:serviceaccount:kube-system:karpenter")); !resp.Allowed {
		t.Fatalf("Karpenter's eviction once the cut is recorded: %+v", resp.Result)
	}

	patchNodeStatus(t, nodes[0], func(n *corev1.Node) { n.Status.Conditions = n.Status.Conditions[:len(n.Status.Conditions)-1] })
	h.Traffic.Timeout = 0 // --admin-state-timeout passed
	if resp := h.Handle(ctx, as("system:serviceaccount:kube-system:karpenter")); !resp.Allowed {
		t.Fatalf("Karpenter's eviction past --admin-state-timeout: %+v", resp.Result)
	}
}

// patchNodeStatus changes the node's status as its writers do.
func patchNodeStatus(t *testing.T, name string, change func(*corev1.Node)) {
	t.Helper()
	node := getNode(t, name)
	patch := client.MergeFrom(node.DeepCopy())
	change(node)
	if err := env.Client.Status().Patch(context.Background(), node, patch); err != nil {
		t.Fatal(err)
	}
}
