package autoscaler_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
	"github.com/nodeguard/nodeguard/internal/autoscaler"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) { harness.Main(m, harness.Options{}, &env) }

// runs numbers the names of each run, so that -count=N runs on one control
// plane.
var runs = map[string]int{}

func fresh(name string) string {
	runs[name]++
	return name + strconv.Itoa(runs[name])
}

// startHold runs the hold and the budget status controller (no Azure: the
// hold waits for the claim only) until the test ends.
func startHold(t *testing.T, disabled bool) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	claimer := &budget.Claimer{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Clock: clock.RealClock{}}
	hold := &autoscaler.HoldReconciler{Client: mgr.GetClient(),
		Rule:    budget.NewRules(claimer, mgr.GetAPIReader(), nil, clock.RealClock{}).Deletion,
		Managed: labels.Everything(), Recorder: mgr.GetEventRecorder("test"), Clock: clock.RealClock{},
		AdminStateTimeout: 30 * time.Second, Disabled: disabled}
	if err := hold.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := (&budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

func createNodes(t *testing.T, pool string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := pool + "-" + strconv.Itoa(i)
		harness.MustCreate(t, env.Client, builder.Node(name, builder.WithLabels("pool", pool), builder.Ready()))
		names = append(names, name)
	}
	return names
}

func getNode(ctx context.Context, name string) (*corev1.Node, error) {
	var n corev1.Node
	err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n)
	return &n, err
}

func taint(t *testing.T, name string, on bool) {
	t.Helper()
	n, err := getNode(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == ngv1alpha1.ClusterAutoscalerTaintKey })
	if on {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey,
			Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule})
	}
	if err := env.Client.Patch(context.Background(), n, patch); err != nil {
		t.Fatal(err)
	}
}

// state is what the hold shows on a node.
type state struct{ held, claimed bool }

func nodeState(ctx context.Context, name string) (state, error) {
	n, err := getNode(ctx, name)
	if err != nil {
		return state{}, err
	}
	_, claimed := n.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
	return state{held: n.Annotations[ngv1alpha1.DelayDeletionAnnotation] == ngv1alpha1.DelayDeletionValue, claimed: claimed}, nil
}

func waitState(t *testing.T, name string, want state) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		s, err := nodeState(ctx, name)
		return s == want, err
	}, "%s: held %v, claimed %v", name, want.held, want.claimed)
}

// TestScaleDownOneAtATimeWithoutAzure: without Azure the hold goes as soon as
// the claim is granted. Two nodes tainted at once under maxUnavailable 1:
// one is released, the other stays held (ScaleDownDenied) until the first is
// gone; a cancelled scale-down gives its claim back.
func TestScaleDownOneAtATimeWithoutAzure(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	pool := fresh("one")
	nodes := createNodes(t, pool, 3)
	harness.MustCreate(t, env.Client, builder.NDB(pool, builder.NDBSelecting("pool", pool), builder.NDBMaxUnavailable("1")))
	startHold(t, false)
	for _, n := range nodes {
		waitState(t, n, state{held: true})
	}
	taint(t, nodes[0], true)
	waitState(t, nodes[0], state{claimed: true})
	taint(t, nodes[1], true)
	harness.WaitForEvent(t, env.Client, nodes[1], autoscaler.ReasonScaleDownDenied)
	if s, err := nodeState(context.Background(), nodes[1]); err != nil || s != (state{held: true}) {
		t.Fatalf("%s while the budget is used up: %+v %v, want held and not claimed", nodes[1], s, err)
	}

	// cluster-autoscaler deletes the first VM; the Node goes.
	first, err := getNode(context.Background(), nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitState(t, nodes[1], state{claimed: true})

	// The second scale-down is cancelled: claim back, hold back.
	taint(t, nodes[1], false)
	waitState(t, nodes[1], state{held: true})
	harness.WaitForEvent(t, env.Client, nodes[1], autoscaler.ReasonScaleDownCancelled)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: pool}, &ndb)
		return err == nil && ndb.Status.DisruptionsAllowed == 1 && len(ndb.Status.DisruptedNodes) == 0, err
	}, "the budget allows one disruption again")
}

// TestScaleDownRespectsAMaintenanceHold: an administrator's maintenance Lease
// refuses the scale-down, whatever the budget allows.
func TestScaleDownRespectsAMaintenanceHold(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	nodes := createNodes(t, fresh("lease"), 2)
	harness.MustCreate(t, env.Client, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: nodes[0]},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kubeadm-alice")},
	})
	startHold(t, false)
	waitState(t, nodes[0], state{held: true})
	taint(t, nodes[0], true)
	harness.WaitForEvent(t, env.Client, nodes[0], autoscaler.ReasonScaleDownDenied)
	notes, err := harness.EventNotes(context.Background(), env.Client, nodes[0], autoscaler.ReasonScaleDownDenied)
	if err != nil || len(notes) == 0 || !slices.ContainsFunc(notes, func(n string) bool {
		return strings.Contains(n, "under maintenance") && strings.Contains(n, "kubeadm-alice")
	}) {
		t.Errorf("denial notes %q (%v), want the maintenance hold named", notes, err)
	}
	if s, err := nodeState(context.Background(), nodes[0]); err != nil || s != (state{held: true}) {
		t.Errorf("%s under a maintenance hold: %+v %v, want held and not claimed", nodes[0], s, err)
	}
	taint(t, nodes[0], false)
}

// TestDisabledHoldRemovesWhatNodeguardSet: with
// --cluster-autoscaler-scale-down-hold=false, nodeguard removes its hold and
// claim mark and leaves other annotations alone.
func TestDisabledHoldRemovesWhatNodeguardSet(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	nodes := createNodes(t, fresh("off"), 1)
	n, err := getNode(context.Background(), nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Annotations = map[string]string{ngv1alpha1.DelayDeletionAnnotation: ngv1alpha1.DelayDeletionValue,
		"delay-deletion.cluster-autoscaler.kubernetes.io/someone-else": "x"}
	if err := env.Client.Patch(context.Background(), n, patch); err != nil {
		t.Fatal(err)
	}
	startHold(t, true)
	waitState(t, nodes[0], state{})
	if n, err := getNode(context.Background(), nodes[0]); err != nil || n.Annotations["delay-deletion.cluster-autoscaler.kubernetes.io/someone-else"] != "x" {
		t.Errorf("another tool's hold was touched: %v %v", n.Annotations, err)
	}
}

// TestNodeWrittenDuringTheHoldPassIsNotAFailure: the hold's node patch carries
// an optimistic lock; when another writer (the kubelet, cluster-autoscaler)
// changes the node between the pass's read and its patch, kube-apiserver
// answers 409. That is no error (no "Reconciler error" with a stack trace):
// the pass runs again soon, and puts the hold on beside the other write.
func TestNodeWrittenDuringTheHoldPassIsNotAFailure(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	name := createNodes(t, fresh("conflict"), 1)[0]
	c, raced := harness.NodePatchRacedOnce(t, env, func(n *corev1.Node) { n.Labels["example.com/other-writer"] = "x" })
	claimer := &budget.Claimer{Client: env.Client, Reader: env.Client, Clock: clock.RealClock{}}
	hold := &autoscaler.HoldReconciler{Client: c, Rule: budget.NewRules(claimer, env.Client, nil, clock.RealClock{}).Deletion,
		Managed: labels.Everything(), Clock: clock.RealClock{}, AdminStateTimeout: 30 * time.Second}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}

	res, err := hold.Reconcile(context.Background(), req)
	if err != nil {
		t.Fatalf("a patch that lost to another writer failed the pass: %v", err)
	}
	if !raced() {
		t.Fatal("the pass patched no node: the race was not played")
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > time.Second {
		t.Errorf("after the conflict the pass asks to run again after %v, want soon", res.RequeueAfter)
	}
	if s, err := nodeState(context.Background(), name); err != nil || s.held {
		t.Fatalf("held %v (%v) although the hold's patch lost the race: the test did not race it", s.held, err)
	}
	if _, err := hold.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	n, err := getNode(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if n.Annotations[ngv1alpha1.DelayDeletionAnnotation] != ngv1alpha1.DelayDeletionValue || n.Labels["example.com/other-writer"] != "x" {
		t.Errorf("after the next pass: annotations %v, labels %v; want the hold on and the other write kept", n.Annotations, n.Labels)
	}
}
