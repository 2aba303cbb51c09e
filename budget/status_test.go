package budget_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) { harness.Main(m, harness.Options{}, &env) }

// warnings records the events the status controller emits, by budget.
type warnings struct {
	mu     sync.Mutex
	events map[string][]string // budget name → "Type Reason"
}

func (w *warnings) Eventf(regarding, _ runtime.Object, eventtype, reason, _, _ string, _ ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	name := regarding.(client.Object).GetName()
	w.events[name] = append(w.events[name], eventtype+" "+reason)
}

func (w *warnings) of(name string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.events[name]...)
}

// startStatusController runs the budget status controller as cmd/nodeguard
// wires it (with the shared claimer), recording its events in the result.
func startStatusController(t *testing.T) (*budget.StatusReconciler, *warnings) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, // one per test
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &warnings{events: map[string][]string{}}
	r := &budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout,
		Claimer: budget.NewClaimer(mgr, nil), Recorder: w}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return r, w
}

// waitForReason waits until the budget's DisruptionAllowed condition has the
// reason for its current generation, and returns the budget.
func waitForReason(t *testing.T, name, reason string) *ngv1alpha1.NodeDisruptionBudget {
	t.Helper()
	var ndb ngv1alpha1.NodeDisruptionBudget
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &ndb); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(ndb.Status.Conditions, ngv1alpha1.ConditionDisruptionAllowed)
		return c != nil && c.Reason == reason && ndb.Status.ObservedGeneration == ndb.Generation, nil
	}, "NodeDisruptionBudget %s reads %s", name, reason)
	return &ndb
}

// passAgain makes the status controller recompute the budget twice more: once
// by a direct pass, once by a spec change whose status it must write.
func passAgain(t *testing.T, r *budget.StatusReconciler, ndb *ngv1alpha1.NodeDisruptionBudget, reason string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: ndb.Name}}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"spec":{"maxUnavailable":2}}`)
	if err := env.Client.Patch(ctx, ndb, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	waitForReason(t, ndb.Name, reason) // the new generation's status is written
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: ndb.Name}}); err != nil {
		t.Fatal(err)
	}
}

func wantOneWarning(t *testing.T, w *warnings, name, reason string) {
	t.Helper()
	if got, want := w.of(name), []string{"Warning " + reason}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events of %s: %v, want %v once", name, got, want)
	}
}

// A budget whose valid selector matches no node says so, in its condition,
// once in a Warning event, and in kubectl get's REASON column.
func TestBudgetSelectingNoNodeSaysSoOnce(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	r, w := startStatusController(t)
	ndb := builder.NDB("no-match", builder.NDBSelecting("pool", "no-such-pool"), builder.NDBMaxUnavailable("1"))
	harness.MustCreate(t, env.Client, ndb)

	got := waitForReason(t, ndb.Name, ngv1alpha1.ReasonNoMatchingNodes)
	if c := meta.FindStatusCondition(got.Status.Conditions, ngv1alpha1.ConditionDisruptionAllowed); !strings.Contains(c.Message, "no node matches spec.selector") {
		t.Errorf("condition message %q, want it to say no node matches", c.Message)
	}
	passAgain(t, r, got, ngv1alpha1.ReasonNoMatchingNodes)
	wantOneWarning(t, w, ndb.Name, ngv1alpha1.ReasonNoMatchingNodes)
	wantReasonColumn(t, ndb.Name, ngv1alpha1.ReasonNoMatchingNodes)
}

// A budget stored with an invalid selector before the CRD refused it (here:
// under a copy of the CRD without the selector rules) is still read and
// written by the status controller, which says the selector is invalid.
func TestBudgetStoredWithAnInvalidSelectorSaysSoOnce(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	badSelector := func(name string) *ngv1alpha1.NodeDisruptionBudget {
		return builder.NDB(name, builder.NDBMaxUnavailable("1"), func(b *ngv1alpha1.NodeDisruptionBudget) {
			b.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "pool", Operator: "Equals", Values: []string{"a"}}}}
		})
	}
	restore := withoutSelectorRules(t)
	ndb := badSelector("from-before")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return env.Client.Create(ctx, ndb.DeepCopy()) == nil, nil
	}, "the looser CRD stores a budget with operator Equals")
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
	restore()
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, badSelector("probe"), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "spec.selector.matchExpressions"), nil
	}, "the shipped CRD refuses operator Equals again")

	r, w := startStatusController(t)
	got := waitForReason(t, ndb.Name, ngv1alpha1.ReasonInvalidSelector)
	c := meta.FindStatusCondition(got.Status.Conditions, ngv1alpha1.ConditionDisruptionAllowed)
	if !strings.Contains(c.Message, "spec.selector") || !strings.Contains(c.Message, `"Equals" is not a valid label selector operator`) {
		t.Errorf("condition message %q, want the selector's error", c.Message)
	}
	passAgain(t, r, got, ngv1alpha1.ReasonInvalidSelector)
	wantOneWarning(t, w, ndb.Name, ngv1alpha1.ReasonInvalidSelector)
	wantReasonColumn(t, ndb.Name, ngv1alpha1.ReasonInvalidSelector)
}

// A budget stored with a window schedule the deletes cannot parse (before the
// budget webhook checked schedules; no webhook runs here) says so once.
func TestBudgetWithAnUnparsableScheduleSaysSoOnce(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	r, w := startStatusController(t)
	ndb := builder.NDB("bad-schedule", builder.NDBMaxUnavailable("1"), func(b *ngv1alpha1.NodeDisruptionBudget) {
		b.Spec.Windows = []ngv1alpha1.DisruptionWindow{{Schedule: "99 99 * * *", Duration: metav1.Duration{Duration: time.Hour}}}
	})
	harness.MustCreate(t, env.Client, ndb)
	got := waitForReason(t, ndb.Name, ngv1alpha1.ReasonInvalidSpec)
	if c := meta.FindStatusCondition(got.Status.Conditions, ngv1alpha1.ConditionDisruptionAllowed); !strings.Contains(c.Message, `windows[0]: schedule "99 99 * * *"`) {
		t.Errorf("condition message %q, want the schedule's error", c.Message)
	}
	passAgain(t, r, got, ngv1alpha1.ReasonInvalidSpec)
	wantOneWarning(t, w, ndb.Name, ngv1alpha1.ReasonInvalidSpec)
}

// withoutSelectorRules installs the CRD without the x-kubernetes-validations
// of spec.selector, as an older nodeguard shipped it; the returned func
// installs the shipped CRD again (also at the test's end).
func withoutSelectorRules(t *testing.T) func() {
	t.Helper()
	ctx := context.Background()
	key := client.ObjectKey{Name: "nodedisruptionbudgets.nodeguard.io"}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := env.Client.Get(ctx, key, &crd); err != nil {
		t.Fatal(err)
	}
	shipped := crd.Spec.DeepCopy()
	selector := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["selector"]
	if len(selector.XValidations) == 0 {
		t.Fatal("the shipped CRD has no rules on spec.selector")
	}
	selector.XValidations = nil
	crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["selector"] = selector
	if err := env.Client.Update(ctx, &crd); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore := func() {
		once.Do(func() {
			if err := env.Client.Get(ctx, key, &crd); err != nil {
				t.Fatal(err)
			}
			crd.Spec = *shipped
			if err := env.Client.Update(ctx, &crd); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Cleanup(restore)
	return restore
}

// wantReasonColumn checks that kubectl get ndb shows the reason in its REASON
// column.
func wantReasonColumn(t *testing.T, name, reason string) {
	t.Helper()
	out := harness.MustKubectl(t, env.Kubeconfig, "", "get", "ndb", name)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get ndb %s:\n%s", name, out)
	}
	// Columns are aligned, and some headers hold a space: read the row at the header's offset.
	at := strings.Index(lines[0], "REASON")
	if at < 0 {
		t.Fatalf("kubectl get ndb %s has no REASON column:\n%s", name, out)
	}
	if at >= len(lines[1]) || !strings.HasPrefix(lines[1][at:], reason+" ") {
		t.Errorf("kubectl get ndb %s: REASON is not %s:\n%s", name, reason, out)
	}
}
