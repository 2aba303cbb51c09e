package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// runs numbers the names of each run, so that -count=N never meets the nodes
// of an earlier run.
var runs atomic.Int64

func uniqueName(prefix string) string { return fmt.Sprintf("%s-r%d", prefix, runs.Add(1)) }

func deleteNode(name string) error {
	return env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// releaseOnCleanup removes every finalizer from the nodes when the test ends,
// so that nodes left deleting go.
func releaseOnCleanup(t *testing.T, names ...string) {
	t.Cleanup(func() {
		for _, name := range names {
			var n corev1.Node
			if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
				continue
			}
			patch := client.MergeFrom(n.DeepCopy())
			n.Finalizers = nil
			_ = env.Client.Patch(context.Background(), &n, patch)
		}
	})
}

// notReady sets the node's Ready condition to False, as a kubelet does that
// reports a problem.
func notReady(n *corev1.Node) {
	now := metav1.Now()
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady",
		Message: "container runtime network not ready", LastHeartbeatTime: now, LastTransitionTime: now,
	})
}

// wantDeleting fails unless the node's deletion went through: it is gone, or
// held only by a finalizer.
func wantDeleting(t *testing.T, name string) {
	t.Helper()
	var n corev1.Node
	err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n)
	if err == nil && n.DeletionTimestamp == nil {
		t.Errorf("node %s is not being deleted", name)
	} else if client.IgnoreNotFound(err) != nil {
		t.Error(err)
	}
}

// wantNotDeleting fails unless the node is still there and not being deleted.
func wantNotDeleting(t *testing.T, name string) {
	t.Helper()
	if n := getNode(t, name); n.DeletionTimestamp != nil {
		t.Errorf("node %s is being deleted, want it kept", name)
	}
}

// Under maxUnavailable 1 with one unavailable node, the budget is used up;
// under AlwaysAllow (the default) deleting that node is still admitted, charges
// nothing and does not lower currentAvailable a second time, and a healthy
// node's delete is still denied. Each way a node counts unavailable.
func TestUnavailableNodeDeletionIsAdmittedUnderAlwaysAllow(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	for _, tc := range []struct {
		name    string
		sick    builder.NodeOption
		wantWhy string
	}{
		{"not-ready", notReady, "not ready"},
		{"unreachable", builder.Unreachable(), "not ready"},
		{"spot-evicted", func(n *corev1.Node) {
			builder.Ready()(n)
			builder.WithTaints(corev1.Taint{Key: ngv1alpha1.SpotEvictionTaintKey, Value: ngv1alpha1.SpotEvictionTaintValue, Effect: corev1.TaintEffectNoSchedule})(n)
		}, "tainted " + ngv1alpha1.SpotEvictionTaintKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := uniqueName("sick-" + tc.name)
			healthy := createReadyNodes(t, pool, 2)
			sick := createNodes(t, pool+"-dead", pool, 1, tc.sick)[0]
			releaseOnCleanup(t, append(healthy, sick)...)
			createBudget(t, pool, 0, builder.NDBMaxUnavailable("1"))

			if err := deleteNode(sick); err != nil {
				t.Fatalf("deleting the unavailable node under a used-up budget: %v, want admitted", err)
			}
			wantDeleting(t, sick)
			ndb := getBudget(t, pool)
			if len(ndb.Status.DisruptedNodes) != 0 || ndb.Status.CurrentAvailable != 2 || ndb.Status.DisruptionsAllowed != 0 {
				t.Errorf("the unavailable node's delete charged the budget: disruptedNodes %v, currentAvailable %d, disruptionsAllowed %d (want none, 2, 0)",
					ndb.Status.DisruptedNodes, ndb.Status.CurrentAvailable, ndb.Status.DisruptionsAllowed)
			}
			err := deleteNode(healthy[0])
			if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "allowed 0, unavailable 1 of max 1") {
				t.Errorf("deleting a healthy node: %v, want a 429 with the budget's numbers", err)
			}
			wantNotDeleting(t, healthy[0])
			waitForEvent(t, "Node", sick, "NodeDeletionAdmitted", "is already unavailable ("+tc.wantWhy+"): its deletion consumes no disruption of "+pool)
		})
	}
}

// Under IfHealthyBudget, an unavailable node goes only while the budget has its
// desired available nodes; otherwise the denial names the policy.
func TestUnavailableNodeDeletionUnderIfHealthyBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	policy := builder.NDBUnhealthyNodeDeletion(ngv1alpha1.IfHealthyBudget)

	t.Run("healthy budget", func(t *testing.T) {
		// 1 dead of 3 under maxUnavailable 1: 2 available of 2 desired.
		pool := uniqueName("ifhealthy-ok")
		healthy := createReadyNodes(t, pool, 2)
		dead := createNodes(t, pool+"-dead", pool, 1, builder.Unreachable())[0]
		releaseOnCleanup(t, append(healthy, dead)...)
		createBudget(t, pool, 0, builder.NDBMaxUnavailable("1"), policy)
		if err := deleteNode(dead); err != nil {
			t.Fatalf("deleting a dead node of a healthy budget: %v, want admitted", err)
		}
		wantDeleting(t, dead)
		if ndb := getBudget(t, pool); len(ndb.Status.DisruptedNodes) != 0 || ndb.Status.CurrentAvailable != 2 {
			t.Errorf("the dead node's delete charged the budget: disruptedNodes %v, currentAvailable %d (want none, 2)",
				ndb.Status.DisruptedNodes, ndb.Status.CurrentAvailable)
		}
	})

	t.Run("unhealthy budget", func(t *testing.T) {
		// 2 dead of 4 under maxUnavailable 1: 2 available of 3 desired.
		pool := uniqueName("ifhealthy-bad")
		healthy := createReadyNodes(t, pool, 2)
		deads := createNodes(t, pool+"-dead", pool, 2, builder.Unreachable())
		releaseOnCleanup(t, append(healthy, deads...)...)
		createBudget(t, pool, 0, builder.NDBMaxUnavailable("1"), policy)
		err := deleteNode(deads[0])
		if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "unhealthyNodeDeletionPolicy IfHealthyBudget") ||
			!strings.Contains(err.Error(), "only 2 of the 3 nodes it wants are available") {
			t.Errorf("deleting a dead node of an unhealthy budget: %v, want a 429 naming the policy and the numbers", err)
		}
		wantNotDeleting(t, deads[0])
		waitForEvent(t, "Node", deads[0], "NodeDeletionDenied", "unhealthyNodeDeletionPolicy IfHealthyBudget")
	})
}

func TestUnhealthyNodeDeletionPolicyIsValidated(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t)) // serves the budget webhook
	ndb := builder.NDB(uniqueName("bad-policy"), builder.NDBMaxUnavailable("1"), builder.NDBUnhealthyNodeDeletion("Sometimes"))
	err := env.Client.Create(context.Background(), ndb)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.unhealthyNodeDeletionPolicy") ||
		!strings.Contains(err.Error(), `"AlwaysAllow", "IfHealthyBudget"`) {
		t.Errorf("creating a budget with policy Sometimes: %v, want invalid, naming the field and the values", err)
	}
	good := builder.NDB(uniqueName("default-policy"), builder.NDBMaxUnavailable("1"))
	harness.MustCreate(t, env.Client, good)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), good) })
	if good.Spec.UnhealthyNodeDeletionPolicy != ngv1alpha1.AlwaysAllowUnhealthy {
		t.Errorf("default policy %q, want AlwaysAllow", good.Spec.UnhealthyNodeDeletionPolicy)
	}
}

// The finalizer webhook's matchConditions keep it from being called for
// nodes that already carry the finalizer: every label, taint or annotation
// change of every node would otherwise go through it.
func TestFinalizerWebhookIsNotCalledForNodesThatHaveTheFinalizer(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	before := finalizerWebhookCalls(t)
	name := createReadyNodes(t, uniqueName("scoped"), 1)[0]
	releaseOnCleanup(t, name)
	created := finalizerWebhookCalls(t)
	if created != before+1 {
		t.Fatalf("creating a node called the finalizer webhook %v times, want 1", created-before)
	}
	if n := getNode(t, name); !strings.Contains(strings.Join(n.Finalizers, ","), ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("node %s has finalizers %v, want %s", name, n.Finalizers, ngv1alpha1.TerminationFinalizer)
	}
	for i, change := range []func(*corev1.Node){
		func(n *corev1.Node) { n.Labels["change"] = "label" },
		func(n *corev1.Node) { n.Annotations = map[string]string{"change": "annotation"} },
		func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "change", Effect: corev1.TaintEffectPreferNoSchedule})
		},
		func(n *corev1.Node) { n.Spec.Unschedulable = true },
	} {
		n := getNode(t, name)
		patch := client.MergeFrom(n.DeepCopy())
		change(n)
		if err := env.Client.Patch(context.Background(), n, patch); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	if got := finalizerWebhookCalls(t); got != created {
		t.Errorf("4 changes of a node with the finalizer called the webhook %v times, want 0", got-created)
	}
}

// finalizerWebhookCalls counts the CREATE and UPDATE requests the webhook
// servers of this process answered.
func finalizerWebhookCalls(t *testing.T) float64 {
	return harness.CounterSum(t, "nodeguard_admission_requests_total", "operation", "CREATE", "UPDATE")
}

// waitForEvent waits for an event of reason about the object (kind, name)
// whose note contains want.
func waitForEvent(t *testing.T, kind, name, reason, want string) {
	t.Helper()
	var seen []string
	harness.Eventually(t, 15*time.Second, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			if e.Regarding.Kind != kind || e.Regarding.Name != name {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == reason && strings.Contains(e.Note, want) {
				return true, nil
			}
		}
		return false, nil
	}, "%s %s has a %s event saying %q (events: %q)", kind, name, reason, want, seen)
}

// createNodes creates n nodes named prefix-i in pool, with options.
func createNodes(t *testing.T, prefix, pool string, n int, opts ...builder.NodeOption) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		harness.MustCreate(t, env.Client, builder.Node(name, append([]builder.NodeOption{builder.WithLabels("pool", pool)}, opts...)...))
		names = append(names, name)
	}
	return names
}
