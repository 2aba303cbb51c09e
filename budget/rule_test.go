package budget

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

type instances map[string]bool

func (i instances) InstanceExists(_ context.Context, n *corev1.Node) (bool, error) {
	return i[n.Name], nil
}

// ruleFixture: budget "a" allows one more disruption, budget "z" none; both
// select every node. It counts the status writes.
func ruleFixture(t *testing.T, objs ...client.Object) (*Rule, client.Client, *atomic.Int32) {
	t.Helper()
	scheme := runtime.NewScheme()
	utilruntime.Must(ngv1alpha1.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))
	a := counted(4, 4, maxUnavailable("1"))
	a.Name = "a"
	z := counted(4, 3, maxUnavailable("1"))
	z.Name = "z"
	var writes atomic.Int32
	cl := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(a, z).WithObjects(append(objs, a, z)...).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			writes.Add(1)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}}).Build()
	clk := clocktesting.NewFakePassiveClock(now)
	rule := &Rule{Claimer: &Claimer{Client: cl, Reader: cl, Clock: clk}, Budgets: cl, Leases: cl, Clock: clk}
	return rule, cl, &writes
}

func disrupted(t *testing.T, c client.Client, budget string) []string {
	t.Helper()
	var b ngv1alpha1.NodeDisruptionBudget
	if err := c.Get(context.Background(), client.ObjectKey{Name: budget}, &b); err != nil {
		t.Fatal(err)
	}
	var out []string
	for n := range b.Status.DisruptedNodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestRuleRefusalLeavesNothingCharged: the first budget charges, the second
// refuses; the verdict names the refusing budget and the first charge is
// given back. The same as a dry run reads the same and writes nothing.
func TestRuleRefusalLeavesNothingCharged(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		rule, c, writes := ruleFixture(t)
		v, err := rule.Decide(context.Background(), node("x"), dryRun)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed || v.Why != WhyBudget || v.Denier == nil || v.Denier.Name != "z" || v.Code != http.StatusTooManyRequests || len(v.Charged) != 0 {
			t.Errorf("dry run %v: verdict %+v, want z's 429 with nothing charged", dryRun, v)
		}
		if got := disrupted(t, c, "a"); len(got) != 0 {
			t.Errorf("dry run %v: a charges %v after the refusal, want nothing", dryRun, got)
		}
		if dryRun && writes.Load() != 0 {
			t.Errorf("a refused dry run wrote %d budget statuses, want none", writes.Load())
		}
	}
}

// TestRuleHoldAndGoneInstance: a maintenance Lease held by an administrator
// refuses with 429 and leaves nothing charged; a NotReady node whose
// instance is gone is let go without a charge or a read of the budgets.
func TestRuleHoldAndGoneInstance(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: "held"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(ngv1alpha1.AdminHolderPrefix + "-alice")}}
	rule, c, _ := ruleFixture(t, lease)
	v, err := rule.Decide(context.Background(), node("held"), false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.Why != WhyMaintenanceHold || v.Code != http.StatusTooManyRequests {
		t.Errorf("held node: verdict %+v, want the hold's 429", v)
	}
	if got := disrupted(t, c, "a"); len(got) != 0 {
		t.Errorf("a charges %v after the hold refused, want nothing", got)
	}

	rule.Instances = instances{"alive": true}
	v, err = rule.Decide(context.Background(), node("gone", notReady), false)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Allowed || v.Why != WhyInstanceGone || len(v.Charged) != 0 {
		t.Errorf("NotReady node with its instance gone: verdict %+v, want allowed uncharged", v)
	}
	v, err = rule.Decide(context.Background(), node("alive", notReady), false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Why == WhyInstanceGone {
		t.Errorf("NotReady node whose instance exists: verdict %+v, want the budgets to decide", v)
	}
}

// TestDecideBeforeBudgetsChargesNothing: the checks Decide makes before the
// budgets, for a door that charges nothing yet: a maintenance hold refuses, a
// gone instance is let go, and otherwise nothing is decided; no budget
// status is written either way.
func TestDecideBeforeBudgetsChargesNothing(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: "held"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(ngv1alpha1.AdminHolderPrefix + "-alice")}}
	rule, _, writes := ruleFixture(t, lease)
	rule.Instances = instances{"held": true, "x": true}
	for _, tc := range []struct {
		node    *corev1.Node
		decided bool
		why     string
	}{
		{node("held"), true, WhyMaintenanceHold},
		{node("gone", notReady), true, WhyInstanceGone},
		{node("x"), false, ""},
	} {
		v, decided, err := rule.DecideBeforeBudgets(context.Background(), tc.node)
		if err != nil {
			t.Fatal(err)
		}
		if decided != tc.decided || v.Why != tc.why || len(v.Charged) != 0 {
			t.Errorf("node %s: decided %v, verdict %+v; want decided %v, why %q", tc.node.Name, decided, v, tc.decided, tc.why)
		}
	}
	if writes.Load() != 0 {
		t.Errorf("DecideBeforeBudgets wrote %d budget statuses, want none", writes.Load())
	}
}

// TestNewRulesDrainRuleReadsNoLease: of the two rules built at start-up, the
// deletion rule is refused by a maintenance Lease someone else holds, and
// the drain rule is not (whoever holds the Lease and drains is the drainer):
// the budgets decide its drain.
func TestNewRulesDrainRuleReadsNoLease(t *testing.T) {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: "held"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(ngv1alpha1.AdminHolderPrefix + "-alice")}}
	fixture, c, _ := ruleFixture(t, lease)
	rules := NewRules(fixture.Claimer, c, nil, fixture.Clock)
	v, err := rules.Deletion.Decide(context.Background(), node("held"), true)
	if err != nil || v.Why != WhyMaintenanceHold {
		t.Errorf("deletion rule: verdict %+v, error %v; want the hold's refusal", v, err)
	}
	v, err = rules.Drain.Decide(context.Background(), node("held"), true)
	if err != nil || v.Why != WhyBudget || v.Denier == nil || v.Denier.Name != "z" {
		t.Errorf("drain rule: verdict %+v, error %v; want budget z's refusal, the Lease unread", v, err)
	}
}

// TestNewRuleListsTheBudgetsFresh (issue #61): the rule a door builds with
// NewRule finds the budgets selecting a node through the claimer's fresh
// Reader, not its informer: a budget the informer has not seen yet (created a
// moment ago) still refuses.
func TestNewRuleListsTheBudgetsFresh(t *testing.T) {
	scheme := runtime.NewScheme()
	utilruntime.Must(ngv1alpha1.AddToScheme(scheme))
	strict := counted(4, 4, maxUnavailable("0"))
	strict.Name = "new"
	fresh := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(strict).WithObjects(strict).Build()
	informer := fake.NewClientBuilder().WithScheme(scheme).Build() // has not seen it
	clk := clocktesting.NewFakePassiveClock(now)
	rule := NewRule(&Claimer{Client: fresh, Reader: fresh, Cache: informer, Clock: clk}, nil, nil, clk)
	v, err := rule.Decide(context.Background(), node("x"), false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || v.Denier == nil || v.Denier.Name != "new" || v.Code != http.StatusForbidden {
		t.Errorf("verdict %+v, want budget new's 403", v)
	}
}
