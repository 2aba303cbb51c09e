package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure/taintwatch"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// tenantWatch is how long the test watches a node after a tenant's forged
// notice: longer than the spot path takes to cut a real one.
const tenantWatch = 60 * time.Second

// TestTenantSpotNoticeCutsNothing: a ServiceAccount with the built-in edit
// role in its own namespace writes a PreemptScheduled Event naming a spot
// node, as any tenant may. For 60 s the node is not tainted, its entries stay
// None and its budget keeps its room. The notice AKS's node-problem-detector
// writes for that node (in default, from its monitor, reported from the node)
// then cuts it as before.
func TestTenantSpotNoticeCutsNothing(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	top := newTopology(t, "spottenant", false)
	patchNodeLabels(t, top.target, ngv1alpha1.SpotPriorityLabel, ngv1alpha1.SpotPriorityValue)
	harness.MustCreate(t, env.Client, builder.NDB(top.ns, builder.NDBSelecting("pool", top.ns), builder.NDBMaxUnavailable("1")))
	startNodeguard(t, env.Kubeconfig, top.emulator)
	waitForBudgetAllowed(t, top.ns, 1)
	var node corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &node); err != nil {
		t.Fatal(err)
	}

	const sa = "app"
	harness.MustCreate(t, env.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: top.ns, Name: sa}})
	harness.MustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: top.ns, Name: sa + "-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: top.ns, Name: sa}},
	})
	tenant, err := env.AsUser("system:serviceaccount:"+top.ns+":"+sa, "system:serviceaccounts", "system:serviceaccounts:"+top.ns)
	if err != nil {
		t.Fatal(err)
	}
	notice := func(namespace, name, involvedNamespace string) *corev1.Event {
		now := metav1.Now()
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: namespace, Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID, Namespace: involvedNamespace},
			Reason:         taintwatch.PreemptScheduledReason, Type: corev1.EventTypeWarning,
			Message:        "Preempt event scheduled for node, the VM will be deleted",
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
			Source:              corev1.EventSource{Component: taintwatch.DefaultSpotEventComponent, Host: node.Name},
			ReportingController: taintwatch.DefaultSpotEventComponent, ReportingInstance: node.Name,
		}
	}
	// Event validation wants a namespaced involvedObject in the Event's own
	// namespace: the tenant's names the node there, and edit may create it.
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return tenant.Create(ctx, notice(top.ns, "forged-preempt", top.ns)) == nil, nil
	}, "the tenant (edit in %s) writes a PreemptScheduled Event naming %s", top.ns, node.Name)

	deadline := time.Now().Add(tenantWatch)
	for time.Now().Before(deadline) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, &n); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == ngv1alpha1.SpotEvictionTaintKey }) {
			t.Fatalf("the tenant's Event tainted %s: %v", node.Name, n.Spec.Taints)
		}
		if states := top.targetStates(); slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=None") }) {
			t.Fatalf("the tenant's Event cut %s: %v", node.Name, states)
		}
		var ndb ngv1alpha1.NodeDisruptionBudget
		if err := env.Client.Get(ctx, client.ObjectKey{Name: top.ns}, &ndb); err != nil {
			t.Fatal(err)
		}
		if ndb.Status.DisruptionsAllowed != 1 {
			t.Fatalf("after the tenant's Event the budget allows %d, want 1", ndb.Status.DisruptionsAllowed)
		}
		time.Sleep(2 * time.Second) // watching that nothing happens: there is no condition to poll for
	}

	harness.MustCreate(t, env.Client, notice(taintwatch.DefaultSpotEventNamespace, "preempt-"+node.Name, ""))
	cut := time.Now()
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		states := top.targetStates()
		return len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=Down") }), nil
	}, "AKS's own notice cuts %s", node.Name)
	t.Logf("AKS's notice cut %s in %s", node.Name, time.Since(cut).Round(100*time.Millisecond))
	harness.WaitForEvent(t, env.Client, node.Name, taintwatch.ReasonSpotEvictionTaintAdded)
}
