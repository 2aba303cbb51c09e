package webhook_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var node corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &node); err != nil {
		t.Fatalf("getting node %s: %v", name, err)
	}
	return &node
}

// patchNode reads the node, changes it and writes the change as a merge patch.
func patchNode(t *testing.T, name string, change func(*corev1.Node)) {
	t.Helper()
	node := getNode(t, name)
	patch := client.MergeFrom(node.DeepCopy())
	change(node)
	if err := env.Client.Patch(context.Background(), node, patch); err != nil {
		t.Fatalf("patching node %s: %v", name, err)
	}
}

// intercepted is a direct client of the test's API server whose calls pass
// through funcs (a failing read, a stale cache, a write observed).
func intercepted(t *testing.T, funcs interceptor.Funcs) client.WithWatch {
	t.Helper()
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return interceptor.NewClient(direct, funcs)
}

func TestFinalizerIsAddedOnCreateAndNothingElseChanges(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	node := builder.Node("create-0", builder.WithLabels("pool", "create"), builder.WithFinalizers("example.com/keep"), builder.Ready())
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	got := getNode(t, "create-0")
	if want := []string{"example.com/keep", ngv1alpha1.TerminationFinalizer}; !slices.Equal(got.Finalizers, want) {
		t.Errorf("finalizers = %v, want %v", got.Finalizers, want)
	}
	if got.Labels["pool"] != "create" || got.Annotations[builder.KwokAnnotation] != "fake" {
		t.Errorf("labels or annotations changed: %v %v", got.Labels, got.Annotations)
	}
}

// TestBackfillAddsFinalizerToNodesFromBeforeInstall creates a node while no
// mutating webhook is installed, as before nodeguard was, and expects the
// backfill controller to add the finalizer.
func TestBackfillAddsFinalizerToNodesFromBeforeInstall(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	var mutating admissionregistrationv1.MutatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "mutating-webhook-configuration"}, &mutating); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &mutating); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mutating.ResourceVersion, mutating.UID = "", ""
		if err := env.Client.Create(ctx, &mutating); err != nil {
			t.Errorf("restoring the mutating webhook: %v", err)
		}
	})
	node := builder.Node("backfill-0", builder.WithLabels("pool", "backfill"), builder.Ready())
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(getNode(t, "backfill-0").Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatal("node got the finalizer without the webhook: the test proves nothing")
	}

	useGuards(t, startGuard(t, true))
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return slices.Contains(getNode(t, "backfill-0").Finalizers, ngv1alpha1.TerminationFinalizer), nil
	}, "the backfill adds the finalizer")
}

// TestKubectlDeleteIsHeldToTheBudget deletes nodes with kubectl through the
// real API server: the first deletion is admitted and the node stays, held by
// the finalizer; the second is denied with a message naming the budget and its
// numbers; a server-side dry run changes nothing.
func TestKubectlDeleteIsHeldToTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "kubectl", 3)
	createBudget(t, "kubectl", 1, builder.NDBMaxUnavailable("1"))

	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "kubectl-0", "--dry-run=server")
	if err != nil || !strings.Contains(out, "deleted (server dry run)") {
		t.Fatalf("dry-run delete: %v\n%s", err, out)
	}
	ndb := getBudget(t, "kubectl")
	if len(ndb.Status.DisruptedNodes) != 0 || getNode(t, "kubectl-0").DeletionTimestamp != nil {
		t.Fatalf("dry run changed something: disruptedNodes %v", ndb.Status.DisruptedNodes)
	}

	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "kubectl-0", "--wait=false"); err != nil {
		t.Fatalf("first delete denied: %v\n%s", err, out)
	}
	admitted := getNode(t, "kubectl-0")
	if admitted.DeletionTimestamp == nil || !slices.Contains(admitted.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("admitted node should still exist with a deletion timestamp and the finalizer: %+v", admitted.ObjectMeta)
	}
	// Charged at once: in disruptedNodes until the node is gone.
	if ndb := getBudget(t, "kubectl"); ndb.Status.DisruptionsAllowed != 0 {
		t.Errorf("after an admitted deletion the budget still allows %d", ndb.Status.DisruptionsAllowed)
	}

	out, err = harness.Kubectl(env.Kubeconfig, "", "delete", "node", "kubectl-1", "--wait=false")
	want := `Error from server (TooManyRequests): admission webhook "delete.nodeguard.io" denied the request: deleting node kubectl-1: NodeDisruptionBudget "kubectl" allows no more disruptions now: allowed 0, unavailable 1 of max 1; retry when a disrupted node is back or gone (kubectl get ndb kubectl)`
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("second delete: err %v, output:\n%s\nwant:\n%s", err, out, want)
	}
	if getNode(t, "kubectl-1").DeletionTimestamp != nil {
		t.Error("denied node is being deleted")
	}

	out, err = harness.Kubectl(env.Kubeconfig, "", "delete", "node", "kubectl-2", "--dry-run=server")
	if err == nil || !strings.Contains(out, "allows no more disruptions now") {
		t.Errorf("dry run of a delete the budget refuses should be refused too: %v\n%s", err, out)
	}

	harness.WaitForEvent(t, env.Client, "kubectl-0", "NodeDeletionAdmitted")
	harness.WaitForEvent(t, env.Client, "kubectl-1", "NodeDeletionDenied")
	harness.WaitForEvent(t, env.Client, "kubectl", "DisruptionDenied")
}

func getBudget(t *testing.T, name string) *ngv1alpha1.NodeDisruptionBudget {
	t.Helper()
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &ndb); err != nil {
		t.Fatal(err)
	}
	return &ndb
}

// TestConcurrentDeletesNeverOverAdmit sends 50 concurrent deletions of distinct
// nodes under maxUnavailable 3 through the API server, 20 times, to one, two
// and three webhook servers answering in turn: exactly 3 are admitted every
// time, since budgets are charged by conditional status writes and no
// in-memory lock. The servers speak HTTP/1.1 as nodeguard does, so the API
// server's concurrent calls spread over them; each must answer its share.
func TestConcurrentDeletesNeverOverAdmit(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const rounds, nodes, budget = 20, 50, 3
	// Three replicas, one of them the leader (the only one running the status
	// controller, as leader election makes it in a cluster).
	all := []*guard{startGuard(t, false), startReplica(t), startReplica(t)}
	for servers := 1; servers <= len(all); servers++ {
		t.Run(fmt.Sprintf("%d webhook servers", servers), func(t *testing.T) {
			guards := all[:servers]
			useGuards(t, guards...)
			before := make([][2]int, servers)
			for i, g := range guards {
				before[i][0], before[i][1] = g.answers.counts(ngwebhook.DeletePath)
			}
			for round := range rounds {
				pool := fmt.Sprintf("race-%d-%d", servers, round)
				names := createReadyNodes(t, pool, nodes)
				createBudget(t, pool, budget, builder.NDBMaxUnavailable(fmt.Sprint(budget)))
				if admitted := deleteAll(t, names); admitted != budget {
					t.Fatalf("round %d: %d deletions admitted, want %d", round, admitted, budget)
				}
				deleting := 0
				for _, name := range names {
					if getNode(t, name).DeletionTimestamp != nil {
						deleting++
					}
				}
				if ndb := getBudget(t, pool); deleting != budget || len(ndb.Status.DisruptedNodes) > budget {
					t.Fatalf("round %d: %d nodes deleting, disruptedNodes %v; want %d", round, deleting, ndb.Status.DisruptedNodes, budget)
				}
			}
			requireShares(t, guards, before, rounds*nodes)
		})
	}
}

// requireShares logs how many DELETE reviews each guard answered (and allowed)
// since before, and fails unless each answered at least a third of an even
// share of the calls: proof that the race ran across every server.
func requireShares(t *testing.T, guards []*guard, before [][2]int, deletes int) {
	t.Helper()
	answered := make([]int, len(guards))
	total := 0
	var shares []string
	for i, g := range guards {
		n, allowed := g.answers.counts(ngwebhook.DeletePath)
		answered[i] = n - before[i][0]
		total += answered[i]
		shares = append(shares, fmt.Sprintf("server %d answered %d (allowed %d)", i+1, answered[i], allowed-before[i][1]))
	}
	t.Logf("%d deletes, %d DELETE reviews: %s", deletes, total, strings.Join(shares, "; "))
	if total < deletes {
		t.Fatalf("%d DELETE reviews answered for %d deletes: some calls never reached a guard", total, deletes)
	}
	for i, n := range answered {
		if n < total/(3*len(guards)) {
			t.Errorf("server %d answered %d of %d DELETE reviews, less than a third of an even share", i+1, n, total)
		}
	}
}

// deleteAll deletes the nodes concurrently and returns how many were admitted.
func deleteAll(t *testing.T, names []string) int {
	t.Helper()
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			switch {
			case err == nil:
				admitted.Add(1)
			case !apierrors.IsTooManyRequests(err):
				t.Errorf("deleting %s: unexpected error %v", name, err)
			}
		}()
	}
	wg.Wait()
	return int(admitted.Load())
}

// TestMaintenanceHoldBlocksDeletion: an administrator's hold (kubeadm...)
// blocks deletion whatever its age, another holder's blocks until it expires.
func TestMaintenanceHoldBlocksDeletion(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	ctx := context.Background()
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ngv1alpha1.MaintenanceLeaseNamespace}})
	createReadyNodes(t, "hold", 3)
	lease := func(node, holder string, renewedAgo time.Duration) {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](60),
				RenewTime: ptr.To(metav1.NewMicroTime(time.Now().Add(-renewedAgo)))},
		}
		if err := env.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	lease("hold-0", "kubeadm-alice", 24*time.Hour)
	lease("hold-1", "upgrade-bot", 0)
	lease("hold-2", "upgrade-bot", 10*time.Minute)

	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "hold-0", "--wait=false")
	if err == nil || !strings.Contains(out, "node hold-0 is under maintenance: its Lease kube-node-maintenance/hold-0 is held by kubeadm-alice until released") {
		t.Errorf("administrator's hold: %v\n%s", err, out)
	}
	out, err = harness.Kubectl(env.Kubeconfig, "", "delete", "node", "hold-1", "--wait=false")
	if err == nil || !strings.Contains(out, "is held by upgrade-bot until") {
		t.Errorf("live hold: %v\n%s", err, out)
	}
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "hold-2", "--wait=false"); err != nil {
		t.Errorf("expired hold should not block: %v\n%s", err, out)
	}
}

// TestDisruptionWindowDeniesWithItsEnd: inside a window allowing no disruption,
// deletion is denied with the time the window ends.
func TestDisruptionWindowDeniesWithItsEnd(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "window", 3)
	createBudget(t, "window", 0, builder.NDBMaxUnavailable("2"), func(b *ngv1alpha1.NodeDisruptionBudget) {
		b.Spec.Windows = []ngv1alpha1.DisruptionWindow{{Schedule: "* * * * *", Duration: metav1.Duration{Duration: time.Hour}}}
	})
	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "window-0", "--wait=false")
	if err == nil || !strings.Contains(out, `NodeDisruptionBudget "window" is in a disruption window (schedule "* * * * *") until `) ||
		!strings.Contains(out, "retry after the window ends") {
		t.Errorf("delete inside a window: %v\n%s", err, out)
	}
	conds := getBudget(t, "window").Status.Conditions
	cond := meta.FindStatusCondition(conds, ngv1alpha1.ConditionDisruptionAllowed)
	if cond == nil || cond.Reason != ngv1alpha1.ReasonWindowActive || cond.Status != metav1.ConditionFalse {
		t.Errorf("conditions = %+v, want DisruptionAllowed False with reason %s", conds, ngv1alpha1.ReasonWindowActive)
	}
	if fires := meta.FindStatusCondition(conds, ngv1alpha1.ConditionWindowsFire); fires == nil || fires.Status != metav1.ConditionTrue {
		t.Errorf("conditions = %+v, want WindowsFire True (the window fires every minute)", conds)
	}
}

// TestEveryMatchingBudgetMustAllow: a node under two budgets is deleted only if
// both allow it; a denial by the second gives back the first one's claim.
func TestEveryMatchingBudgetMustAllow(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	createReadyNodes(t, "multi", 2, builder.WithLabels("zone", "multi-z"))
	createBudget(t, "multi", 1, builder.NDBMaxUnavailable("1"))
	strict := builder.NDB("multi-zz-strict", builder.NDBSelecting("zone", "multi-z"), builder.NDBMaxUnavailable("0"))
	if err := env.Client.Create(context.Background(), strict); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), strict) })
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return getBudget(t, "multi-zz-strict").Status.ObservedGeneration == 1, nil
	}, "the strict budget is evaluated")

	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "multi-0", "--wait=false")
	if err == nil || !strings.Contains(out, "Error from server (Forbidden)") ||
		!strings.Contains(out, `NodeDisruptionBudget "multi-zz-strict" allows no disruption of its 2 nodes`) {
		t.Fatalf("delete under a budget allowing none: %v\n%s", err, out)
	}
	if ndb := getBudget(t, "multi"); len(ndb.Status.DisruptedNodes) != 0 || ndb.Status.DisruptionsAllowed != 1 {
		t.Errorf("first budget's claim was not given back: %+v", ndb.Status)
	}
}

// TestMissingFinalizerNeverLetsANodeGoUnguarded: a node without the finalizer
// (created while the webhook was unreachable) is never deleted unguarded.
// kube-apiserver decides "delete at once" from the node it read before
// admission; when the webhook adds the finalizer and denies, the API server sees
// the node changed and runs admission again within the same request (seen here
// on v1.36: allowing that second call removed the node, finalizer and all). So
// the delete is denied, a retry right after is denied too, and a retry a few
// seconds later is guarded: the node ends up deleting, held by the finalizer,
// with its budget charged.
func TestMissingFinalizerNeverLetsANodeGoUnguarded(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t) // nodeguard down: the finalizer webhook fails open
	createReadyNodes(t, "late", 2)
	if slices.Contains(getNode(t, "late-0").Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatal("node got the finalizer with nodeguard down")
	}
	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "late-0", "--wait=false")
	if err == nil || !strings.Contains(out, `failed calling webhook "delete.nodeguard.io"`) {
		t.Fatalf("with nodeguard down, failurePolicy Fail should refuse the delete: %v\n%s", err, out)
	}

	useGuards(t, startGuard(t, false))
	createBudget(t, "late", 1, builder.NDBMaxUnavailable("1"))
	out, err = harness.Kubectl(env.Kubeconfig, "", "delete", "node", "late-0", "--wait=false")
	// What kubectl shows is the answer to the API server's second admission call.
	if err == nil || !strings.Contains(out, "retry the delete") {
		t.Fatalf("first delete: %v\n%s", err, out)
	}
	if node := getNode(t, "late-0"); node.DeletionTimestamp != nil || !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("after the first delete the node should carry the finalizer and not be deleting: %+v", node.ObjectMeta)
	}
	// The immediate retry goes out from this process as soon as the first
	// answer is in: a kubectl start in between could outlast the hold.
	err = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "late-0"}})
	if err == nil || !strings.Contains(err.Error(), "retry the delete in a few seconds") {
		t.Fatalf("an immediate retry should be denied: %v", err)
	}
	harness.Eventually(t, 15*time.Second, func(context.Context) (bool, error) {
		out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "late-0", "--wait=false")
		if err != nil && !strings.Contains(out, "retry the delete in a few seconds") {
			return false, fmt.Errorf("unexpected denial: %s", out)
		}
		return err == nil, nil
	}, "a later retry is admitted")
	if node := getNode(t, "late-0"); node.DeletionTimestamp == nil || !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("admitted node should be deleting and held by the finalizer: %+v", node.ObjectMeta)
	}
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		return getBudget(t, "late").Status.DisruptionsAllowed == 0, nil
	}, "the deletion is charged to the budget")
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "late-1", "--wait=false"); err == nil {
		t.Errorf("a second deletion should be over the budget:\n%s", out)
	}
	startGuard(t, true)
	harness.Eventually(t, 15*time.Second, func(context.Context) (bool, error) {
		return slices.Contains(getNode(t, "late-1").Finalizers, ngv1alpha1.TerminationFinalizer), nil
	}, "late-1 carries the finalizer")
	harness.Eventually(t, 15*time.Second, func(context.Context) (bool, error) {
		_, marked := getNode(t, "late-1").Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
		return !marked, nil
	}, "the backfill removes the finalizer-added-at mark after the hold")
	// A node being deleted is not written for it: no admission reads it.
	if _, marked := getNode(t, "late-0").Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]; !marked {
		t.Error("the backfill wrote a node being deleted to remove its finalizer-added-at mark")
	}
}

// TestAPIServerDeletesANodeWhoseFinalizerWasAddedDuringItsDelete is the
// experiment behind the finalizer-added-at hold: a webhook that adds a
// finalizer to the node during DELETE admission and then allows the delete
// does not save the node. kube-apiserver decided "delete now" from the node it
// read before admission, and removes it, finalizer and all. If this ever fails,
// the API server changed and the hold may no longer be needed.
func TestAPIServerDeletesANodeWhoseFinalizerWasAddedDuringItsDelete(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startExperiment(t))
	createReadyNodes(t, "experiment", 1)
	if slices.Contains(getNode(t, "experiment-0").Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatal("the experiment's node should start without the finalizer")
	}
	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", "experiment-0", "--wait=false"); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	err := env.Client.Get(context.Background(), client.ObjectKey{Name: "experiment-0"}, &corev1.Node{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("the node survived (err %v): a finalizer added during DELETE admission now protects that delete", err)
	}
}

// TestFinalizerAddedByAnUpdateHoldsDeletesBriefly: a node that came up while
// nodeguard was down gets the finalizer from the mutating webhook on its next
// update, marked with the time. A delete the API server decided from the node
// as it was before that update runs its admission on the node as it is now;
// the mark makes that admission (like any delete in the next few seconds)
// retry, so that no delete decided without the finalizer is carried out.
func TestFinalizerAddedByAnUpdateHoldsDeletesBriefly(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	useGuards(t) // nodeguard down: the finalizer webhook fails open
	createReadyNodes(t, "updated", 1)
	useGuards(t, startGuard(t, false))
	createBudget(t, "updated", 1, builder.NDBMaxUnavailable("1"))

	node := getNode(t, "updated-0")
	patch := client.MergeFrom(node.DeepCopy())
	node.Labels["touched"] = "yes"
	if err := env.Client.Patch(ctx, node, patch); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("the update should have added the finalizer: %v", node.Finalizers)
	}
	if _, marked := node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]; !marked {
		t.Fatalf("the update added the finalizer without the %s mark: %v", ngv1alpha1.FinalizerAddedAtAnnotation, node.Annotations)
	}
	err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "updated-0"}})
	if err == nil || !strings.Contains(err.Error(), "retry the delete in a few seconds") {
		t.Fatalf("a delete right after the update should be told to retry: %v", err)
	}
	harness.Eventually(t, 15*time.Second, func(context.Context) (bool, error) {
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "updated-0"}})
		if err != nil && !strings.Contains(err.Error(), "retry the delete in a few seconds") {
			return false, fmt.Errorf("unexpected denial: %w", err)
		}
		return err == nil, nil
	}, "a later delete is admitted")
	if node := getNode(t, "updated-0"); node.DeletionTimestamp == nil || !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("admitted node should be deleting and held by the finalizer: %+v", node.ObjectMeta)
	}
}
