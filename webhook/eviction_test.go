package webhook_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// createPod creates a bare pod bound to node (no scheduler, no kubelet: it
// stays as created, which is all an eviction's admission reads).
func createPod(t *testing.T, name, node string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), pod, client.GracePeriodSeconds(0))
	})
	return pod
}

// cordon marks the node unschedulable, as kubectl drain does before its
// first eviction (sent at once: the guard must not rely on its cache having
// seen the cordon).
func cordon(t *testing.T, name string) {
	t.Helper()
	patchNode(t, name, func(n *corev1.Node) { n.Spec.Unschedulable = true })
}

// evict asks the Eviction API to evict the pod, as kubectl drain does.
func evict(pod *corev1.Pod, dryRun bool) error {
	e := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if dryRun {
		e.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	return env.Client.SubResource("eviction").Create(context.Background(), pod, e)
}

// endDrain does what the termination controller does once a drained node is
// schedulable and Ready again: uncordon (here), remove the drain marks and
// give the budget's charge back.
func endDrain(t *testing.T, budgetName, node string) {
	t.Helper()
	patchNode(t, node, func(n *corev1.Node) {
		n.Spec.Unschedulable = false
		delete(n.Annotations, ngv1alpha1.DrainChargedAtAnnotation)
		delete(n.Annotations, ngv1alpha1.DrainedByAnnotation)
	})
	if err := newReplica().Release(context.Background(), budgetName, node); err != nil {
		t.Fatal(err)
	}
}

// drainCharged reads the node's drain mark.
func drainCharged(t *testing.T, name string) (string, bool) {
	t.Helper()
	return ngv1alpha1.DrainCharged(getNode(t, name))
}

// TestDrainsInOneBudgetTakeTurns: two drains (cordon, then evict) of nodes
// under a budget of one disruption. The first eviction from the first node
// charges the budget and marks the node; a dry run and an eviction from a
// schedulable node charge nothing; the second node's eviction is refused with
// 429 naming the budget and the node that holds it, until that node is back.
func TestDrainsInOneBudgetTakeTurns(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	g := startGuard(t, false)
	useGuards(t, g)
	createReadyNodes(t, "drains", 3)
	createBudget(t, "drains", 1, builder.NDBMaxUnavailable("1"))
	first, second, elsewhere := createPod(t, "drains-a", "drains-0"), createPod(t, "drains-b", "drains-1"), createPod(t, "drains-c", "drains-2")

	if err := evict(elsewhere, true); err != nil {
		t.Fatalf("dry-run eviction from a schedulable node: %v", err)
	}
	cordon(t, "drains-0")
	if err := evict(first, true); err != nil {
		t.Fatalf("dry-run eviction from a cordoned node within the budget: %v", err)
	}
	if ndb := getBudget(t, "drains"); len(ndb.Status.DisruptedNodes) != 0 {
		t.Fatalf("a dry run charged the budget: %v", ndb.Status.DisruptedNodes)
	}
	if _, charged := drainCharged(t, "drains-0"); charged {
		t.Fatal("a dry run marked the node")
	}

	if err := evict(first, false); err != nil {
		t.Fatalf("first eviction of the first drain: %v", err)
	}
	by, charged := drainCharged(t, "drains-0")
	if !charged || by == "" {
		t.Fatalf("the drained node is not marked charged (by %q)", by)
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return getBudget(t, "drains").Status.DisruptionsAllowed == 0, nil
	}, "the budget counts the drained node out")

	cordon(t, "drains-1")
	err := evict(second, false)
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), `NodeDisruptionBudget "drains" allows no more disruptions now`) ||
		!strings.Contains(err.Error(), "drains-0 (drained by "+by+")") {
		t.Fatalf("second drain's eviction: want 429 naming the budget and drains-0, got %v", err)
	}
	if _, charged := drainCharged(t, "drains-1"); charged {
		t.Fatal("the refused drain marked its node")
	}
	if err := evict(elsewhere, false); err != nil {
		t.Fatalf("an eviction from a schedulable node is refused while the budget is spent: %v", err)
	}
	harness.WaitForEvent(t, env.Client, "drains-0", ngwebhook.ReasonDrainCharged)
	harness.WaitForEvent(t, env.Client, "drains-1", ngwebhook.ReasonDrainDenied)
	harness.WaitForEvent(t, env.Client, "drains", budget.ReasonDisruptionDenied)

	// The first node back (what the termination controller does once it is
	// schedulable and Ready): the second drain gets its turn.
	endDrain(t, "drains", "drains-0")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return evict(second, false) == nil, nil
	}, "the second drain's eviction is admitted once the first node is back")
	if _, charged := drainCharged(t, "drains-1"); !charged {
		t.Fatal("the second drain did not mark its node")
	}
}

// evictionHandler is an eviction handler on the test's API server, called directly.
func evictionHandler(t *testing.T, gate ngwebhook.TrafficGate) *ngwebhook.EvictionHandler {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.Config)
	claimer := newReplica()
	return &ngwebhook.EvictionHandler{
		Pods: ngwebhook.NewPodNodes(cs, env.Client), Nodes: env.Client, Reader: env.Client, Client: env.Client,
		Rule:    &budget.Rule{Claimer: claimer, Budgets: env.Client, Clock: clock.RealClock{}},
		Managed: labels.Everything(), Traffic: gate, Clock: clock.RealClock{}, Timeout: ngwebhook.DefaultEvictionTimeout,
	}
}

func evictionReview(namespace, name string, deleteOptions *metav1.DeleteOptions) admission.Request {
	e := policyv1.Eviction{TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, DeleteOptions: deleteOptions}
	raw, _ := json.Marshal(e)
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: namespace, Name: name, SubResource: "eviction",
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Object:   runtime.RawExtension{Raw: raw}, UserInfo: authenticationv1.UserInfo{Username: "upgrader"},
	}}
}

// TestEvictionBadInputChargesNothing: an eviction of a pod that does not
// exist, of a pod on no node, or one nodeguard did not expect is admitted
// with no claim and no mark.
func TestEvictionBadInputChargesNothing(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "badevict", 2)
	createBudget(t, "badevict", 1, builder.NDBMaxUnavailable("1"))
	createPod(t, "badevict-unbound", "")
	cordon(t, "badevict-0")
	h := evictionHandler(t, ngwebhook.TrafficGate{})
	ctx := context.Background()

	for _, tc := range []struct {
		name string
		req  admission.Request
	}{
		{"no such pod", evictionReview("default", "badevict-nosuch", nil)},
		{"pod on no node", evictionReview("default", "badevict-unbound", nil)},
		{"not an eviction", func() admission.Request {
			r := evictionReview("default", "badevict-unbound", nil)
			r.SubResource = "status"
			return r
		}()},
	} {
		if resp := h.Handle(ctx, tc.req); !resp.Allowed {
			t.Errorf("%s: refused: %+v", tc.name, resp.Result)
		}
	}
	if ndb := getBudget(t, "badevict"); len(ndb.Status.DisruptedNodes) != 0 {
		t.Errorf("bad input charged the budget: %v", ndb.Status.DisruptedNodes)
	}
}

// TestEvictionFromASchedulableNodeOutlivesAFailedRead: the fresh read of a
// node the cache shows schedulable is only a look for a cordon the cache may
// lag. When it fails (kube-apiserver throttling nodeguard, a timeout), the
// eviction is admitted: a refusal there would stop every eviction in the
// cluster (descheduler, Karpenter consolidation, a rollout's), which
// failurePolicy Ignore avoids when nodeguard is down.
func TestEvictionFromASchedulableNodeOutlivesAFailedRead(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "failread", 1)
	createBudget(t, "failread", 1, builder.NDBMaxUnavailable("1"))
	pod := createPod(t, "failread-pod", "failread-0")
	h := evictionHandler(t, ngwebhook.TrafficGate{})
	h.Reader = intercepted(t, interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewTooManyRequests("throttled by API Priority and Fairness", 1)
		},
	})
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		return h.Nodes.Get(ctx, client.ObjectKey{Name: "failread-0"}, &n) == nil, nil
	}, "the cache shows the node")
	if resp := h.Handle(context.Background(), evictionReview(pod.Namespace, pod.Name, nil)); !resp.Allowed {
		t.Fatalf("eviction from a schedulable node refused when the fresh read failed: %+v", resp.Result)
	}
	if ndb := getBudget(t, "failread"); len(ndb.Status.DisruptedNodes) != 0 {
		t.Errorf("the admitted eviction charged the budget: %v", ndb.Status.DisruptedNodes)
	}
}

// TestScaleDownEvictionsWaitForTheBudgetClaim: cluster-autoscaler taints a
// node ToBeDeletedByClusterAutoscaler and evicts its pods at once, without a
// cordon. Until nodeguard's hold has charged the scale-down to the node's
// budgets, those evictions are refused with 429 (cluster-autoscaler retries
// for 2 minutes, then abandons the scale-down and keeps the node): admitted,
// a scale-down the budgets refuse drained the node all the same. Charged,
// they wait while the hold is still on (the traffic cut); then they are
// admitted. With the hold off (--cluster-autoscaler-scale-down-hold=false)
// nothing waits.
func TestScaleDownEvictionsWaitForTheBudgetClaim(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	ctx := context.Background()
	node := createReadyNodes(t, "scaledown", 2)[0]
	createBudget(t, "scaledown", 1, builder.NDBMaxUnavailable("1"))
	pod := createPod(t, "scaledown-pod", node)
	patchNode(t, node, func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey, Value: "1764633600", Effect: corev1.TaintEffectNoSchedule})
	})
	h := evictionHandler(t, ngwebhook.TrafficGate{})
	review := evictionReview(pod.Namespace, pod.Name, nil)

	resp := h.Handle(ctx, review)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "not admitted by its NodeDisruptionBudgets yet") {
		t.Fatalf("eviction from a node whose scale-down is not charged yet: allowed %v, %+v; want 429", resp.Allowed, resp.Result)
	}
	if ndb := getBudget(t, "scaledown"); len(ndb.Status.DisruptedNodes) != 0 {
		t.Errorf("the refused eviction charged the budget: %v (the scale-down is the hold's to charge)", ndb.Status.DisruptedNodes)
	}

	h.Signals = ngv1alpha1.NewSignals(ngv1alpha1.DefaultSignalTaints, false)
	if resp := h.Handle(ctx, review); !resp.Allowed {
		t.Errorf("with the scale-down hold off, the eviction was refused: %+v", resp.Result)
	}
	h.Signals = nil

	// Shut down meanwhile (out-of-service): the node cannot wait for the hold.
	patchNode(t, node, func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	})
	if resp := h.Handle(ctx, review); !resp.Allowed {
		t.Errorf("eviction from an out-of-service node being scaled down: refused %+v", resp.Result)
	}
	patchNode(t, node, func(n *corev1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.OutOfServiceTaintKey })
	})
	unclaimed := getNode(t, node) // what a replica's cache holds until the leader's claim reaches it

	patchNode(t, node, func(n *corev1.Node) {
		n.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation] = ngv1alpha1.FormatTime(time.Now())
	})
	if resp := h.Handle(ctx, review); !resp.Allowed {
		t.Errorf("eviction from a node whose scale-down is charged: refused %+v", resp.Result)
	}
	// Charged, but the hold still on (with Azure, until the node's entries are
	// confirmed Down): the pods wait for the traffic cut.
	setHold := func(on bool) {
		patchNode(t, node, func(n *corev1.Node) {
			if on {
				n.Annotations[ngv1alpha1.DelayDeletionAnnotation] = ngv1alpha1.DelayDeletionValue
			} else {
				delete(n.Annotations, ngv1alpha1.DelayDeletionAnnotation)
			}
		})
	}
	setHold(true)
	if resp := h.Handle(ctx, review); resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "traffic is being cut") {
		t.Errorf("eviction from a node whose scale-down is charged but still held for its traffic cut: allowed %v, %+v; want 429", resp.Allowed, resp.Result)
	}
	setHold(false)
	if resp := h.Handle(ctx, review); !resp.Allowed {
		t.Errorf("eviction once the hold let the scale-down go: refused %+v", resp.Result)
	}
	h.Nodes = intercepted(t, interceptor.Funcs{
		Get: func(_ context.Context, _ client.WithWatch, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
			unclaimed.DeepCopyInto(obj.(*corev1.Node))
			return nil
		},
	})
	if resp := h.Handle(ctx, review); !resp.Allowed {
		t.Errorf("eviction refused from a cache that has not seen the scale-down's claim yet: %+v", resp.Result)
	}
}

// TestRedrainSoonAfterTheEndIsChargedAgain: a drain ends (the node back, its
// marks removed and its charge given back, as the termination controller
// does) and the node is drained again within seconds. The new drain's first
// eviction charges the budget again: the mark this replica wrote for the
// first drain must not stand in for the cache once the cache has seen the
// node since.
func TestRedrainSoonAfterTheEndIsChargedAgain(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	ctx := context.Background()
	node := createReadyNodes(t, "redrain", 2)[0]
	createBudget(t, "redrain", 1, builder.NDBMaxUnavailable("1"))
	first, second := createPod(t, "redrain-a", node), createPod(t, "redrain-b", node)
	h := evictionHandler(t, ngwebhook.TrafficGate{})

	cordon(t, node)
	if resp := h.Handle(ctx, evictionReview(first.Namespace, first.Name, nil)); !resp.Allowed {
		t.Fatalf("first drain's eviction: %+v", resp.Result)
	}
	if _, charged := drainCharged(t, node); !charged {
		t.Fatal("the first drain did not mark its node")
	}
	endDrain(t, "redrain", node)

	cordon(t, node)
	if resp := h.Handle(ctx, evictionReview(second.Namespace, second.Name, nil)); !resp.Allowed {
		t.Fatalf("second drain's eviction: %+v", resp.Result)
	}
	if _, charged := drainCharged(t, node); !charged {
		t.Error("the second drain, seconds after the first ended, left its node unmarked: its traffic is not cut and it counts available")
	}
	if _, charged := getBudget(t, "redrain").Status.DisruptedNodes[node]; !charged {
		t.Errorf("the second drain is not charged to the budget: %v", getBudget(t, "redrain").Status.DisruptedNodes)
	}
}

// TestEvictionWaitsForTheTrafficCut: with Azure, evictions from a charged node
// are refused with 429 until its traffic cut is recorded, then admitted; a
// dry run is never held.
func TestEvictionWaitsForTheTrafficCut(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "cutevict", 2)
	createBudget(t, "cutevict", 1, builder.NDBMaxUnavailable("1"))
	createPod(t, "cutevict-a", "cutevict-0")
	cordon(t, "cutevict-0")
	h := evictionHandler(t, ngwebhook.TrafficGate{Enabled: true, Timeout: time.Hour})
	ctx := context.Background()

	if resp := h.Handle(ctx, evictionReview("default", "cutevict-a", &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})); !resp.Allowed {
		t.Fatalf("dry run held: %+v", resp.Result)
	}
	resp := h.Handle(ctx, evictionReview("default", "cutevict-a", nil))
	if resp.Allowed || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "traffic is being cut") {
		t.Fatalf("first eviction: want 429 while the traffic is cut, got allowed=%v %+v", resp.Allowed, resp.Result)
	}
	node := getNode(t, "cutevict-0")
	if by, charged := ngv1alpha1.DrainCharged(node); !charged || by != "upgrader" {
		t.Fatalf("the node is not marked charged by the requester: %v", node.Annotations)
	}
	// The termination controller records the confirmed cut as it does.
	patch := client.MergeFrom(node.DeepCopy())
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
		Type: ngv1alpha1.TrafficCutCondition, Status: corev1.ConditionTrue, Reason: "AdminStateDown",
		LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now(),
	})
	if err := env.Client.Status().Patch(ctx, node, patch); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, error) {
		return h.Handle(ctx, evictionReview("default", "cutevict-a", nil)).Allowed, nil
	}, "evictions are admitted once the cut is recorded")
}

// TestDrainedNodeIsNotChargedTwiceByItsDelete: a node whose drain was charged
// and is then deleted (kubectl drain, then kubectl delete node) is admitted
// without a second disruption: the budget still allows the one it had left
// for another node.
func TestDrainedNodeIsNotChargedTwiceByItsDelete(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	g := startGuard(t, false)
	useGuards(t, g)
	createReadyNodes(t, "drainthendelete", 4)
	createBudget(t, "drainthendelete", 2, builder.NDBMaxUnavailable("2"))
	pod := createPod(t, "drainthendelete-a", "drainthendelete-0")
	cordon(t, "drainthendelete-0")
	if err := evict(pod, false); err != nil {
		t.Fatalf("first eviction: %v", err)
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var cached corev1.Node
		err := g.cache.Get(ctx, client.ObjectKey{Name: "drainthendelete-0"}, &cached)
		_, charged := ngv1alpha1.DrainCharged(&cached)
		return charged && getBudget(t, "drainthendelete").Status.DisruptionsAllowed == 1, err
	}, "the budget counts the drained node out, and the guard's cache shows it")

	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "drainthendelete-0", "--wait=false"); err != nil {
		t.Fatalf("deleting the drained node: %v\n%s", err, out)
	}
	if ndb := getBudget(t, "drainthendelete"); ndb.Status.DisruptionsAllowed != 1 {
		t.Fatalf("the delete of the drained node charged again: %d allowed, disruptedNodes %v", ndb.Status.DisruptionsAllowed, ndb.Status.DisruptedNodes)
	}
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "drainthendelete-1", "--wait=false", "--dry-run=server"); err != nil {
		t.Errorf("the budget's last disruption is gone after the drained node's delete: %v\n%s", err, out)
	}
}
