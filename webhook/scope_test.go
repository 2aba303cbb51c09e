package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

func deleteNode(name string) error {
	return env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// Under AlwaysAllow (the default), deleting a node the budget already counts
// unavailable consumes no disruption and does not lower currentAvailable
// again; a healthy node's delete still needs an allowed disruption.
func TestUnavailableNodeDeletionIsAdmittedUnderAlwaysAllow(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	healthy := createReadyNodes(t, "sick-always", 2)
	dead := createNodes(t, "sick-always-dead", "sick-always", 1, builder.Unreachable())[0]
	createBudget(t, "sick-always", 0, builder.NDBMaxUnavailable("1"))

	if err := deleteNode(dead); err != nil {
		t.Fatalf("deleting the dead node under a used-up budget: %v, want admitted", err)
	}
	if err := deleteNode(healthy[0]); !apierrors.IsTooManyRequests(err) {
		t.Errorf("deleting a healthy node: %v, want a 429 denial", err)
	}
	ndb := getBudget(t, "sick-always")
	if len(ndb.Status.DisruptedNodes) != 0 || ndb.Status.CurrentAvailable != 2 {
		t.Errorf("the dead node's delete charged the budget: disruptedNodes %v, currentAvailable %d (want none, 2)",
			ndb.Status.DisruptedNodes, ndb.Status.CurrentAvailable)
	}
	// The status controller, seeing the node deleting, counts it once.
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		ndb := getBudget(t, "sick-always")
		return ndb.Status.CurrentAvailable == 2 && ndb.Status.ExpectedNodes == 3, nil
	}, "the budget counts the deleted dead node unavailable once")
}

// Under IfHealthyBudget, an unavailable node goes only while the budget has its
// desired available nodes; otherwise the denial names the policy.
func TestUnavailableNodeDeletionUnderIfHealthyBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	policy := builder.NDBUnhealthyNodeDeletion(ngv1alpha1.IfHealthyBudget)

	// 1 dead of 3 under maxUnavailable 1: 2 available of 2 desired, healthy.
	createReadyNodes(t, "sick-ok", 2)
	dead := createNodes(t, "sick-ok-dead", "sick-ok", 1, builder.Unreachable())[0]
	createBudget(t, "sick-ok", 0, builder.NDBMaxUnavailable("1"), policy)
	if err := deleteNode(dead); err != nil {
		t.Errorf("deleting a dead node of a healthy budget: %v, want admitted", err)
	}

	// 2 dead of 4 under maxUnavailable 1: 2 available of 3 desired.
	createReadyNodes(t, "sick-bad", 2)
	deads := createNodes(t, "sick-bad-dead", "sick-bad", 2, builder.Unreachable())
	createBudget(t, "sick-bad", 0, builder.NDBMaxUnavailable("1"), policy)
	err := deleteNode(deads[0])
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "unhealthyNodeDeletionPolicy IfHealthyBudget") {
		t.Errorf("deleting a dead node of an unhealthy budget: %v, want a 429 naming the policy", err)
	}
}

func TestUnhealthyNodeDeletionPolicyIsValidated(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ndb := builder.NDB("bad-policy", builder.NDBMaxUnavailable("1"), builder.NDBUnhealthyNodeDeletion("Sometimes"))
	err := env.Client.Create(context.Background(), ndb)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "unhealthyNodeDeletionPolicy") {
		t.Errorf("creating a budget with policy Sometimes: %v, want invalid", err)
	}
	good := builder.NDB("default-policy", builder.NDBMaxUnavailable("1"))
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
	name := createReadyNodes(t, "scoped", 1)[0]
	created := finalizerWebhookCalls(t)
	if created != before+1 {
		t.Fatalf("creating a node called the finalizer webhook %v times, want 1", created-before)
	}
	for i := range 3 {
		n := getNode(t, name)
		patch := client.MergeFrom(n.DeepCopy())
		n.Labels["change"] = string(rune('a' + i))
		if err := env.Client.Patch(context.Background(), n, patch); err != nil {
			t.Fatal(err)
		}
	}
	if got := finalizerWebhookCalls(t); got != created {
		t.Errorf("3 label changes of a node with the finalizer called the webhook %v times, want 0", got-created)
	}
}

// finalizerWebhookCalls counts the CREATE and UPDATE requests the webhook
// servers of this process answered.
func finalizerWebhookCalls(t *testing.T) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "nodeguard_admission_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" && (l.GetValue() == "CREATE" || l.GetValue() == "UPDATE") {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// With nodeguard down and the DELETE webhook scoped to the managed nodes (its
// objectSelector mirrors --node-selector), deleting a node nodeguard does not
// manage still works; deleting a managed one is refused (failurePolicy Fail).
func TestWithNodeguardDownOnlyManagedNodeDeletesAreRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t) // nothing answers
	const managedLabel = "scope.nodeguard.io/managed"
	restore := scopeDeleteWebhook(t, &metav1.LabelSelector{MatchLabels: map[string]string{managedLabel: "true"}})
	defer restore()
	unmanaged := createReadyNodes(t, "outside", 1)[0]
	managed := createReadyNodes(t, "inside", 1, builder.WithLabels(managedLabel, "true"))[0]

	if err := deleteNode(unmanaged); err != nil {
		t.Errorf("with nodeguard down, deleting an unmanaged node: %v, want it deleted", err)
	}
	err := deleteNode(managed)
	if err == nil || !strings.Contains(err.Error(), `failed calling webhook "delete.nodeguard.io"`) {
		t.Errorf("with nodeguard down, deleting a managed node: %v, want refused by the webhook", err)
	}
}

// scopeDeleteWebhook sets the DELETE webhook's objectSelector, as the Helm
// chart's webhook.objectSelector does, and returns how to undo it.
func scopeDeleteWebhook(t *testing.T, sel *metav1.LabelSelector) func() {
	t.Helper()
	ctx := context.Background()
	var list admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		cfg := &list.Items[i]
		for j := range cfg.Webhooks {
			if cfg.Webhooks[j].Name != "delete.nodeguard.io" {
				continue
			}
			old := cfg.Webhooks[j].ObjectSelector
			cfg.Webhooks[j].ObjectSelector = sel
			if err := env.Client.Update(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			probe := createReadyNodes(t, "scope-probe", 1)[0]
			waitForDeleteWebhookScope(t, probe, false)
			return func() {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
					t.Error(err)
					return
				}
				cfg.Webhooks[j].ObjectSelector = old
				if err := env.Client.Update(ctx, cfg); err != nil {
					t.Error(err)
				}
				waitForDeleteWebhookScope(t, probe, true)
			}
		}
	}
	t.Fatal("no delete.nodeguard.io webhook installed")
	return nil
}

// waitForDeleteWebhookScope waits until the API server applies a webhook
// configuration change: a dry-run delete of probe (with nodeguard down) is
// refused by the DELETE webhook when covered, and goes through when not.
func waitForDeleteWebhookScope(t *testing.T, probe string, covered bool) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: probe}}, client.DryRunAll)
		refused := err != nil && strings.Contains(err.Error(), `failed calling webhook "delete.nodeguard.io"`)
		return refused == covered, nil
	}, "the API server applies the DELETE webhook's new objectSelector (node %s covered: %v)", probe, covered)
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
