package webhook_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/karpenter"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

var nodeClaimKind = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaim"}

// goneInstances says the instances of the named nodes are gone.
type goneInstances map[string]bool

func (g goneInstances) InstanceExists(_ context.Context, n *corev1.Node) (bool, error) {
	return !g[n.Name], nil
}

// installNodeClaimCRD installs the test NodeClaim CRD (testdata: a minimal
// one written for these tests) and waits until it is served.
func installNodeClaimCRD(t *testing.T) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "karpenter.sh_nodeclaims.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(context.Background(), &crd); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(nodeClaimKind.GroupVersion().WithKind("NodeClaimList"))
		return env.Client.List(ctx, &list) == nil, nil
	}, "NodeClaims are served")
}

// createNodeClaim creates a NodeClaim whose status names node ("" for none),
// with labels given as key, value pairs.
func createNodeClaim(t *testing.T, name, node string, keyValues ...string) {
	t.Helper()
	ctx := context.Background()
	nc := &unstructured.Unstructured{}
	nc.SetGroupVersionKind(nodeClaimKind)
	nc.SetName(name)
	if len(keyValues) > 0 {
		l := map[string]string{}
		for i := 0; i+1 < len(keyValues); i += 2 {
			l[keyValues[i]] = keyValues[i+1]
		}
		nc.SetLabels(l)
	}
	if err := unstructured.SetNestedField(nc.Object, map[string]any{"nodeClassRef": map[string]any{"name": "default"}}, "spec"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	if node == "" {
		return
	}
	if err := unstructured.SetNestedField(nc.Object, map[string]any{"nodeName": node, "providerID": "azure:///" + node}, "status"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Status().Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

func deleteNodeClaim(name string) (string, error) {
	return harness.Kubectl(env.Kubeconfig, "", "delete", "nodeclaims.karpenter.sh", name, "--wait=false")
}

// TestNodeClaimDeleteAppliesTheBudget: Karpenter disrupts three nodes of a
// pool at once (each tainted karpenter.sh/disrupted, then its NodeClaim
// deleted) under a budget that allows one more disruption. The first NodeClaim DELETE is
// admitted and charged; the second is denied with the budget's numbers (the
// disrupted taints alone do not use the budget up); the NodeClaim of a
// NotReady node whose instance is gone is admitted whatever the budget says,
// and so is one that never got a node. nodeguard started before the CRD
// existed: it does not need it.
func TestNodeClaimDeleteAppliesTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	mgr, addr, answers := newManager(t)
	if err := ngwebhook.Register(mgr, ngwebhook.Options{Managed: labels.Everything(), DeleteTimeout: ngwebhook.DefaultDeleteTimeout,
		Rules: doorRules(mgr, nil, goneInstances{"karp-3": true})}); err != nil {
		t.Fatal(err)
	}
	if err := (&budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	useGuards(t, run(t, mgr, addr, answers))
	installNodeClaimCRD(t)

	disrupted := corev1.Taint{Key: ngv1alpha1.KarpenterDisruptedTaintKey, Effect: corev1.TaintEffectNoSchedule}
	nodes := createReadyNodes(t, "karp", 3, builder.WithTaints(disrupted))
	dead := builder.Node("karp-3", builder.WithLabels("pool", "karp"), builder.WithTaints(disrupted), builder.WithoutKubelet(), builder.Unreachable())
	if err := env.Client.Create(context.Background(), dead); err != nil {
		t.Fatal(err)
	}
	// 4 nodes, one NotReady, maxUnavailable 2: one more may go.
	createBudget(t, "karp", 1, builder.NDBMaxUnavailable("2"))
	for i, n := range append(nodes, "karp-3") {
		createNodeClaim(t, fmt.Sprintf("karp-claim-%d", i), n)
	}
	createNodeClaim(t, "karp-claim-unregistered", "")

	if out, err := deleteNodeClaim("karp-claim-0"); err != nil {
		t.Fatalf("first NodeClaim delete refused: %v\n%s", err, out)
	}
	if _, charged := getBudget(t, "karp").Status.DisruptedNodes["karp-0"]; !charged {
		t.Errorf("the budget does not charge karp-0: %v", getBudget(t, "karp").Status.DisruptedNodes)
	}
	out, err := deleteNodeClaim("karp-claim-1")
	if err == nil || !strings.Contains(out, `deleting NodeClaim karp-claim-1 (node karp-1): NodeDisruptionBudget "karp" allows no more disruptions now: allowed 0, unavailable 2 of max 2`) {
		t.Errorf("second NodeClaim delete: %v\n%s", err, out)
	}
	if out, err := deleteNodeClaim("karp-claim-3"); err != nil {
		t.Errorf("NodeClaim of a NotReady node whose instance is gone refused: %v\n%s", err, out)
	}
	if out, err := deleteNodeClaim("karp-claim-unregistered"); err != nil {
		t.Errorf("NodeClaim without a node refused: %v\n%s", err, out)
	}
	harness.WaitForEvent(t, env.Client, "karp-1", ngwebhook.ReasonNodeClaimDeletionDenied)
	harness.WaitForEvent(t, env.Client, "karp-0", ngwebhook.ReasonNodeClaimDeletionAdmitted)
	if total, _ := answers.counts(ngwebhook.NodeClaimDeletePath); total != 3 {
		t.Errorf("the NodeClaim webhook answered %d reviews, want 3 (none for the NodeClaim without a node)", total)
	}
}

// TestKarpenterNodeDeleteIsAdmittedOnlyWhileItsNodeClaimIsDeleting: Karpenter
// puts its termination finalizer on every node it registers, with its
// NodeClaim as the node's owner. A Node DELETE of such a node is a delete like
// any other (refused by a budget that allows nothing) until its NodeClaim is
// being deleted: then Karpenter terminates it, the NodeClaim DELETE was
// charged, and the Node DELETE that follows is admitted.
func TestKarpenterNodeDeleteIsAdmittedOnlyWhileItsNodeClaimIsDeleting(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	mgr, addr, answers := newManager(t)
	if err := ngwebhook.Register(mgr, ngwebhook.Options{Managed: labels.Everything(), DeleteTimeout: ngwebhook.DefaultDeleteTimeout,
		Rules: doorRules(mgr, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	if err := (&budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	useGuards(t, run(t, mgr, addr, answers))
	installNodeClaimCRD(t)

	// A NodeClaim without a node is not sent to nodeguard: it is deleted
	// directly, and its finalizer keeps it deleting.
	createNodeClaim(t, "karp-owner-claim", "")
	node := createReadyNodes(t, "karp-owner", 1, builder.WithFinalizers(ngv1alpha1.KarpenterTerminationFinalizer))[0]
	releaseOnCleanup(t, node)
	claim := ownNodeClaim(t, "karp-owner-claim", node, true)
	createBudget(t, "karp-owner", 0, builder.NDBMaxUnavailable("0"))

	if err := deleteNode(node); err == nil || !strings.Contains(err.Error(), `NodeDisruptionBudget "karp-owner" allows no`) {
		t.Fatalf("deleting a Karpenter node whose NodeClaim is not deleting: %v, want refused by the budget", err)
	}
	wantNotDeleting(t, node)
	if out, err := deleteNodeClaim(claim.GetName()); err != nil {
		t.Fatalf("deleting the NodeClaim: %v\n%s", err, out)
	}
	if err := deleteNode(node); err != nil {
		t.Fatalf("deleting a Karpenter node whose NodeClaim is deleting: %v, want admitted", err)
	}
	wantDeleting(t, node)
	harness.WaitForEvent(t, env.Client, node, ngwebhook.ReasonDeletionAdmitted)
}

// ownNodeClaim makes the node owned by the NodeClaim, as Karpenter registers
// its nodes, and with finalized puts Karpenter's termination finalizer on the
// NodeClaim, so that its delete leaves it deleting until the finalizer goes.
func ownNodeClaim(t *testing.T, name, node string, finalized bool) *unstructured.Unstructured {
	t.Helper()
	ctx := context.Background()
	claim := &unstructured.Unstructured{}
	claim.SetGroupVersionKind(nodeClaimKind)
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, claim); err != nil {
		t.Fatal(err)
	}
	if finalized {
		claim.SetFinalizers([]string{ngv1alpha1.KarpenterTerminationFinalizer})
		if err := env.Client.Update(ctx, claim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unfinalize(t, claim) })
	}
	patchNode(t, node, func(n *corev1.Node) {
		n.OwnerReferences = []metav1.OwnerReference{{APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: claim.GetName(), UID: claim.GetUID()}}
	})
	return claim
}

// unfinalize removes the NodeClaim's finalizers: Karpenter's termination ran.
func unfinalize(t *testing.T, claim *unstructured.Unstructured) {
	t.Helper()
	err := env.Client.Patch(context.Background(), claim, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

// TestChargedNodeClaimDeletionOutlastsTheClaimTimeout: Karpenter's NodeClaim
// finalizer deletes the Node, and a backlog or a restart of Karpenter can
// hold it past --disruption-claim-timeout. The node shows no deletion until
// then, and its Node DELETE will be admitted on the charge the NodeClaim
// delete made (karpenter.Terminates), so the budget must keep that charge
// while the NodeClaim is deleting: dropping it let another door take the
// disruption (maxUnavailable exceeded once Karpenter came back). A NodeClaim
// that is gone (removed by force) is the control: its claim goes at the
// timeout, as does the slow one's once its NodeClaim goes.
func TestChargedNodeClaimDeletionOutlastsTheClaimTimeout(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const claimTimeout = 4 * time.Second
	mgr, addr, answers := newManager(t)
	setupGuard(t, mgr, true, false, func(r *budget.StatusReconciler) {
		r.ClaimTimeout, r.UnconfirmedTimeout = claimTimeout, testUnconfirmedTimeout
		r.DisruptionPending = karpenter.NodeClaimDeleting(mgr.GetAPIReader())
	})
	useGuards(t, run(t, mgr, addr, answers))
	installNodeClaimCRD(t)
	pool := uniqueName("slow-karp")
	nodes := createReadyNodes(t, pool, 4)
	releaseOnCleanup(t, nodes...)
	createBudget(t, pool, 2, builder.NDBMaxUnavailable("2"))
	createNodeClaim(t, pool+"-slow", nodes[0])
	createNodeClaim(t, pool+"-forced", nodes[1])
	slow := ownNodeClaim(t, pool+"-slow", nodes[0], true)
	ownNodeClaim(t, pool+"-forced", nodes[1], false)

	for _, claim := range []string{pool + "-slow", pool + "-forced"} {
		if out, err := deleteNodeClaim(claim); err != nil {
			t.Fatalf("NodeClaim %s delete refused: %v\n%s", claim, err, out)
		}
	}
	harness.Eventually(t, claimTimeout+15*time.Second, func(context.Context) (bool, error) {
		_, control := getBudget(t, pool).Status.DisruptedNodes[nodes[1]]
		return !control, nil
	}, "the claim of %s, whose NodeClaim is gone, goes at the claim timeout", nodes[1])
	ndb := getBudget(t, pool)
	if _, kept := ndb.Status.DisruptedNodes[nodes[0]]; !kept || ndb.Status.DisruptionsAllowed != 1 {
		t.Fatalf("past the claim timeout, with its NodeClaim still deleting, the claim of %s: kept %v, the budget allows %d (want kept, 1): disruptedNodes %v",
			nodes[0], kept, ndb.Status.DisruptionsAllowed, ndb.Status.DisruptedNodes)
	}

	unfinalize(t, slow)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		_, kept := getBudget(t, pool).Status.DisruptedNodes[nodes[0]]
		return !kept, nil
	}, "the claim of %s goes once its NodeClaim is gone", nodes[0])
}

// TestChargedNodeClaimDeletionKeepsItsClaimUntilItsNodeGoes: Karpenter
// deleted a NodeClaim and nodeguard charged it; Karpenter deletes the Node
// only after the NodeClaim's finalizer ran, which a backlog or a leader
// change can delay past --unconfirmed-claim-timeout. The charge marks the
// node, so the status controller keeps the claim as a disruption under way.
// A forged DELETE review charged after it is the control: once the status
// controller has given that one back as unconfirmed, it has judged the
// NodeClaim's claim past its own deadline too. The late Node delete is then
// admitted on the claim it already has.
func TestChargedNodeClaimDeletionKeepsItsClaimUntilItsNodeGoes(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	mgr, addr, answers := newManager(t)
	setupGuard(t, mgr, true, false, func(r *budget.StatusReconciler) { r.UnconfirmedTimeout = testUnconfirmedTimeout })
	g := run(t, mgr, addr, answers)
	useGuards(t, g)
	installNodeClaimCRD(t)
	pool := uniqueName("late-karp")
	nodes := createReadyNodes(t, pool, 3)
	releaseOnCleanup(t, nodes...)
	createBudget(t, pool, 2, builder.NDBMaxUnavailable("2"))
	claim := pool + "-claim"
	createNodeClaim(t, claim, nodes[0])

	if out, err := deleteNodeClaim(claim); err != nil {
		t.Fatalf("NodeClaim delete refused: %v\n%s", err, out)
	}
	if _, marked := getNode(t, nodes[0]).Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation]; !marked {
		t.Fatalf("node %s carries no %s mark after its NodeClaim's deletion was charged", nodes[0], ngv1alpha1.NodeClaimDeleteChargedAtAnnotation)
	}
	if resp := postDeleteReview(t, g, nodes[1], false); !resp.Allowed {
		t.Fatalf("the control's forged review denied: %+v", resp.Result)
	}
	harness.Eventually(t, testUnconfirmedTimeout+10*time.Second, func(context.Context) (bool, error) {
		_, control := getBudget(t, pool).Status.DisruptedNodes[nodes[1]]
		return !control, nil
	}, "the control's forged claim of %s is given back as unconfirmed", nodes[1])
	if _, kept := getBudget(t, pool).Status.DisruptedNodes[nodes[0]]; !kept {
		t.Fatalf("the NodeClaim deletion's claim of %s was given back before its node went: disruptedNodes %v",
			nodes[0], getBudget(t, pool).Status.DisruptedNodes)
	}

	if err := deleteNode(nodes[0]); err != nil {
		t.Fatalf("Karpenter's late Node delete refused: %v", err)
	}
	wantDeleting(t, nodes[0])
	if ndb := getBudget(t, pool); ndb.Status.DisruptionsAllowed != 1 {
		t.Errorf("after the late Node delete the budget allows %d, want 1 (one disruption, charged once)", ndb.Status.DisruptionsAllowed)
	}
}
