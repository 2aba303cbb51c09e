package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// newReplica is one webhook replica's claimer: its own group commit and its
// own copy of the budgets it last wrote.
func newReplica() *budget.Claimer {
	return &budget.Claimer{Client: env.Client, Reader: env.Client, Clock: clock.RealClock{}}
}

// countedBudget creates a budget over `expected` available nodes allowing
// maxUnavailable of them, with its status written as the status controller
// would: the claims read nothing else. No status controller runs, so nothing
// but the claimers writes the budget; a webhook replica serves the budget
// webhook for the create.
func countedBudget(t *testing.T, name string, expected, maxUnavailable int32) {
	t.Helper()
	useGuards(t, startReplica(t))
	countedBudgetSelecting(t, name, "pool", name, expected, maxUnavailable)
}

// countedBudgetSelecting is countedBudget selecting the nodes labelled
// key=value; a webhook replica must serve the budget webhook (useGuards).
func countedBudgetSelecting(t *testing.T, name, key, value string, expected, maxUnavailable int32) {
	t.Helper()
	ctx := context.Background()
	ndb := builder.NDB(name, builder.NDBSelecting(key, value), builder.NDBMaxUnavailable(fmt.Sprint(maxUnavailable)))
	if err := env.Client.Create(ctx, ndb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ndb) })
	ndb.Status = ngv1alpha1.NodeDisruptionBudgetStatus{ObservedGeneration: ndb.Generation, ExpectedNodes: expected,
		CurrentAvailable: expected, DesiredAvailable: expected - maxUnavailable, DisruptionsAllowed: maxUnavailable}
	if err := env.Client.Status().Update(ctx, ndb); err != nil {
		t.Fatal(err)
	}
}

func readyNodeObject(name string) *corev1.Node { return builder.Node(name, builder.Ready()) }

// claim claims node of budget through c and returns (charged, denial code):
// code 0 when admitted; it fails the test on any other error.
// deletionRule is the Node DELETE's rule over claimer: it reads maintenance
// Leases from the test's API server.
func deletionRule(claimer *budget.Claimer) *budget.Rule {
	return budget.NewRules(claimer, env.Client, nil, clock.RealClock{}).Deletion
}

func claim(t *testing.T, c *budget.Claimer, name, node string) (bool, int32) {
	t.Helper()
	charged, err := c.Claim(context.Background(), name, readyNodeObject(node), false)
	var denial *budget.Denial
	if errors.As(err, &denial) {
		return false, denial.Code
	}
	if err != nil {
		t.Errorf("claiming %s of %s: %v", node, name, err)
	}
	return charged, 0
}

func requireCharged(t *testing.T, name string, want ...string) {
	t.Helper()
	ndb := getBudget(t, name)
	if got := slices.Sorted(maps.Keys(ndb.Status.DisruptedNodes)); !slices.Equal(got, want) {
		t.Fatalf("disruptedNodes of %s = %v, want %v", name, got, want)
	}
	if ndb.Status.DisruptionsAllowed < 0 {
		t.Fatalf("%s allows %d disruptions", name, ndb.Status.DisruptionsAllowed)
	}
}

// TestConcurrentClaimsInOneReplicaEachGetTheirVerdict: 20 concurrent claims of
// distinct nodes through one claimer, on a budget allowing 5: exactly 5 are
// charged and the 15 others are each denied with 429 and the budget's numbers.
// Claiming a charged node again charges nothing; releases and new claims
// racing each other never take the budget past its limit.
func TestConcurrentClaimsInOneReplicaEachGetTheirVerdict(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const name = "group"
	countedBudget(t, name, 20, 5)
	c := newReplica()
	var mu sync.Mutex
	var charged []string
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("group-%d", i)
			ok, err := c.Claim(context.Background(), name, readyNodeObject(node), false)
			var denial *budget.Denial
			switch {
			case ok && err == nil:
				mu.Lock()
				charged = append(charged, node)
				mu.Unlock()
			case errors.As(err, &denial):
				if denial.Code != http.StatusTooManyRequests || !strings.Contains(denial.Message, "allowed 0, unavailable 5 of max 5") {
					t.Errorf("%s: denial %d %q, want 429 with the budget's numbers", node, denial.Code, denial.Message)
				}
			default:
				t.Errorf("%s: charged %v, error %v", node, ok, err)
			}
		}()
	}
	wg.Wait()
	slices.Sort(charged)
	if len(charged) != 5 {
		t.Fatalf("%d claims charged (%v), want 5", len(charged), charged)
	}
	requireCharged(t, name, charged...)

	for _, node := range charged {
		if ok, code := claim(t, c, name, node); ok || code != 0 {
			t.Errorf("claiming the charged %s again: charged %v, denial %d; want admitted without a charge", node, ok, code)
		}
	}
	requireCharged(t, name, charged...)

	// Two releases race ten new claims: whatever the order, the budget holds
	// the 3 kept claims plus at most the 2 freed.
	var newly []string
	for _, node := range charged[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Release(context.Background(), name, node); err != nil {
				t.Errorf("releasing %s: %v", node, err)
			}
		}()
	}
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("group-new-%d", i)
			if ok, _ := claim(t, c, name, node); ok {
				mu.Lock()
				newly = append(newly, node)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(newly) > 2 {
		t.Fatalf("%d new claims charged (%v) after 2 releases, want at most 2", len(newly), newly)
	}
	requireCharged(t, name, slices.Sorted(slices.Values(append(slices.Clone(charged[2:]), newly...)))...)
}

// TestStaleCopyNeverOverAdmits: each replica reuses the budget its last write
// returned. Another replica's writes make that copy stale; a claim decided from
// it must end in a conflict and a fresh read, never in an admission the budget
// no longer allows, nor in "already charged" for a claim given back since.
func TestStaleCopyNeverOverAdmits(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	a, b := newReplica(), newReplica()

	t.Run("the other replica used the last disruption", func(t *testing.T) {
		const name = "stale-full"
		countedBudget(t, name, 4, 2)
		if ok, code := claim(t, a, name, "n0"); !ok || code != 0 {
			t.Fatalf("replica A's first claim: charged %v, denial %d", ok, code)
		}
		if ok, code := claim(t, b, name, "n1"); !ok || code != 0 {
			t.Fatalf("replica B's claim: charged %v, denial %d", ok, code)
		}
		// A's copy still allows one more.
		if ok, code := claim(t, a, name, "n2"); ok || code != http.StatusTooManyRequests {
			t.Fatalf("replica A's claim past the budget: charged %v, denial %d; want 429", ok, code)
		}
		requireCharged(t, name, "n0", "n1")
	})

	t.Run("the other replica gave the claim back", func(t *testing.T) {
		const name = "stale-released"
		countedBudget(t, name, 4, 2)
		if ok, code := claim(t, a, name, "n0"); !ok || code != 0 {
			t.Fatalf("replica A's first claim: charged %v, denial %d", ok, code)
		}
		if err := b.Release(ctx, name, "n0"); err != nil {
			t.Fatal(err)
		}
		for _, node := range []string{"n1", "n2"} {
			if ok, code := claim(t, b, name, node); !ok || code != 0 {
				t.Fatalf("replica B's claim of %s: charged %v, denial %d", node, ok, code)
			}
		}
		// A's copy says n0 is charged; it is not, and the budget is full.
		if ok, code := claim(t, a, name, "n0"); ok || code != http.StatusTooManyRequests {
			t.Fatalf("replica A's claim of n0, given back since: charged %v, denial %d; want 429", ok, code)
		}
		requireCharged(t, name, "n1", "n2")
	})
}

// frozenCache is an informer that stopped at one version of a budget.
type frozenCache struct {
	client.Reader
	ndb *ngv1alpha1.NodeDisruptionBudget
}

func (f frozenCache) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	f.ndb.DeepCopyInto(obj.(*ngv1alpha1.NodeDisruptionBudget))
	return nil
}

// TestStaleInformerCopyNeverOverAdmits: a claim that starts from an informer
// copy older than the budget ends in a conflict and a fresh read.
func TestStaleInformerCopyNeverOverAdmits(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const name = "stale-informer"
	countedBudget(t, name, 4, 2)
	frozen := frozenCache{ndb: getBudget(t, name)}
	b := newReplica()
	for _, node := range []string{"n0", "n1"} {
		if ok, code := claim(t, b, name, node); !ok || code != 0 {
			t.Fatalf("replica B's claim of %s: charged %v, denial %d", node, ok, code)
		}
	}
	a := newReplica()
	a.Cache = frozen // still allows 2
	if ok, code := claim(t, a, name, "n2"); ok || code != http.StatusTooManyRequests {
		t.Fatalf("claim from a stale informer copy: charged %v, denial %d; want 429", ok, code)
	}
	requireCharged(t, name, "n0", "n1")
}

// TestClaimPastItsDeadlineIsATryAgain: a claim whose time is up before it is
// decided is a 429 "try again", and charges nothing.
func TestClaimPastItsDeadlineIsATryAgain(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const name = "deadline"
	countedBudget(t, name, 4, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := newReplica().Claim(ctx, name, readyNodeObject("n0"), false)
	var denial *budget.Denial
	if !errors.As(err, &denial) || denial.Code != http.StatusTooManyRequests || !strings.Contains(denial.Message, "retry the delete") {
		t.Fatalf("claim after its deadline: %v, want a 429 asking to retry", err)
	}
	requireCharged(t, name)
}

// TestMaintenanceHoldGivesBackTheClaim: the DELETE webhook reads the node's
// maintenance Lease while it claims the budgets; a hold found denies the delete
// and gives the claim back, so the budget's disruption is still there for
// another node.
func TestMaintenanceHoldGivesBackTheClaim(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startGuard(t, false))
	ctx := context.Background()
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ngv1alpha1.MaintenanceLeaseNamespace}})
	names := createReadyNodes(t, "heldclaim", 2)
	createBudget(t, "heldclaim", 1, builder.NDBMaxUnavailable("1"))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: names[0]},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kubeadm-bob")},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), lease) })

	err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[0]}})
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "is under maintenance") {
		t.Fatalf("deleting the held node: %v, want 429 naming the hold", err)
	}
	if ndb := getBudget(t, "heldclaim"); len(ndb.Status.DisruptedNodes) != 0 || ndb.Status.DisruptionsAllowed != 1 {
		t.Fatalf("the held node's claim was not given back: %+v", ndb.Status)
	}
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[1]}}); err != nil {
		t.Fatalf("deleting the other node: %v", err)
	}
	if ndb := getBudget(t, "heldclaim"); ndb.Status.DisruptionsAllowed != 0 {
		t.Errorf("after the other node's delete the budget still allows %d", ndb.Status.DisruptionsAllowed)
	}
}

// staleFor is a fresh reader that answers, for one budget, with a copy from
// before its last change: a read that raced a concurrent write.
type staleFor struct {
	client.Reader
	ndb *ngv1alpha1.NodeDisruptionBudget
}

func (s staleFor) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if b, ok := obj.(*ngv1alpha1.NodeDisruptionBudget); ok && key.Name == s.ndb.Name {
		s.ndb.DeepCopyInto(b)
		return nil
	}
	return s.Reader.Get(ctx, key, obj, opts...)
}

// TestDryRunDeleteNeverGivesBackARealClaim: a real delete of node x was
// admitted within budget "dry-a" (x is charged there); budget "dry-b", which
// selects x too, is full. A `kubectl delete node x --dry-run=server` whose
// read of dry-a raced that charge finds room there, then is refused by
// dry-b. A dry run writes nothing: the real delete's charge stays.
func TestDryRunDeleteNeverGivesBackARealClaim(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	useGuards(t, startReplica(t))
	countedBudgetSelecting(t, "dry-a", "dry-a", "yes", 4, 1)
	countedBudgetSelecting(t, "dry-b", "dry-b", "yes", 4, 1)
	before := getBudget(t, "dry-a")
	node := builder.Node("dry-x", builder.Ready(), builder.WithLabels("dry-a", "yes", "dry-b", "yes"))
	node.Finalizers = []string{ngv1alpha1.TerminationFinalizer}
	real := newReplica()
	if _, err := real.Claim(ctx, "dry-a", node, false); err != nil {
		t.Fatalf("the real delete's claim: %v", err)
	}
	if ok, code := claim(t, real, "dry-b", "dry-y"); !ok || code != 0 {
		t.Fatalf("filling dry-b: charged %v, denial %d", ok, code)
	}

	stale := &budget.Claimer{Client: env.Client, Reader: staleFor{Reader: env.Client, ndb: before}, Clock: clock.RealClock{}}
	h := &ngwebhook.DeleteHandler{Client: env.Client, Reader: env.Client, Rule: deletionRule(stale),
		Managed: labels.Everything(), Clock: clock.RealClock{}, Timeout: ngwebhook.DefaultDeleteTimeout}
	resp := h.Handle(ctx, deleteRequest(t, node, true))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "dry-b") {
		t.Fatalf("dry-run delete = allowed %v, %+v; want dry-b's 429", resp.Allowed, resp.Result)
	}
	requireCharged(t, "dry-a", "dry-x")
	requireCharged(t, "dry-b", "dry-y")
}

// deleteRequest is the admission request of a Node DELETE the API server
// decided from node as given.
func deleteRequest(t *testing.T, node *corev1.Node, dryRun bool) admission.Request {
	t.Helper()
	node = node.DeepCopy()
	node.APIVersion, node.Kind = "v1", "Node"
	raw, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "delete-" + types.UID(node.Name), Name: node.Name, Operation: admissionv1.Delete, DryRun: ptr.To(dryRun),
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Node"}, OldObject: runtime.RawExtension{Raw: raw}}}
}

// TestDeleteKeepsAFinalizerAddedMeanwhile: the DELETE of a node that lacks
// nodeguard's finalizer makes the handler add it. Another controller
// (Karpenter, at registration) added its own finalizer after the API server
// read the node for the delete: nodeguard's patch carries the node's
// resourceVersion, so it is refused and the delete told to retry, and the
// other finalizer stays. The retry, from the node as it is now, adds
// nodeguard's finalizer beside it.
func TestDeleteKeepsAFinalizerAddedMeanwhile(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	useGuards(t) // nodeguard down: the node is created without its finalizer
	name := createReadyNodes(t, "lock", 1)[0]
	const other = "example.com/other"
	t.Cleanup(func() {
		node := getNode(t, name)
		patch := client.MergeFrom(node.DeepCopy())
		node.Finalizers = slices.DeleteFunc(node.Finalizers, func(f string) bool { return f == other })
		_ = env.Client.Patch(context.Background(), node, patch)
	})
	read := getNode(t, name) // what the API server decided the delete from
	fresh := read.DeepCopy()
	patch := client.MergeFrom(read.DeepCopy())
	fresh.Finalizers = append(fresh.Finalizers, other)
	if err := env.Client.Patch(ctx, fresh, patch); err != nil {
		t.Fatal(err)
	}

	h := &ngwebhook.DeleteHandler{Client: env.Client, Reader: env.Client, Rule: deletionRule(newReplica()),
		Managed: labels.Everything(), Clock: clock.RealClock{}, Timeout: ngwebhook.DefaultDeleteTimeout}
	resp := h.Handle(ctx, deleteRequest(t, read, false))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests || !strings.Contains(resp.Result.Message, "changed") {
		t.Fatalf("delete decided from a node changed since = allowed %v, %+v; want a 429 to retry", resp.Allowed, resp.Result)
	}
	if got := getNode(t, name).Finalizers; !slices.Equal(got, []string{other}) {
		t.Fatalf("finalizers after the refused patch = %v, want the other controller's [%s] kept", got, other)
	}

	resp = h.Handle(ctx, deleteRequest(t, getNode(t, name), false))
	if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, "retry the delete") {
		t.Fatalf("the retried delete = allowed %v, %+v; want the finalizer added and a retry asked", resp.Allowed, resp.Result)
	}
	if got := getNode(t, name).Finalizers; !slices.Contains(got, other) || !slices.Contains(got, ngv1alpha1.TerminationFinalizer) {
		t.Fatalf("finalizers = %v, want %s beside %s", got, ngv1alpha1.TerminationFinalizer, other)
	}
}

func charges(ndb *ngv1alpha1.NodeDisruptionBudget, node string) bool {
	_, ok := ndb.Status.DisruptedNodes[node]
	return ok
}

// TestRefusedDeleteGivesBackOnlyItsOwnClaim: two real deletes of node x on two
// replicas, with x under budgets "own-a" (room) and "own-b" (full: y holds
// its one disruption). Delete A charges own-a and is refused by own-b. Before
// A's give-back is written, y's disruption ends and delete B runs: it finds x
// charged in own-a, takes own-b's freed disruption and is admitted. A's
// give-back must not remove the own-a charge that B's admitted delete of x
// relies on.
func TestRefusedDeleteGivesBackOnlyItsOwnClaim(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	useGuards(t, startReplica(t))
	countedBudgetSelecting(t, "own-a", "own-a", "yes", 4, 1)
	countedBudgetSelecting(t, "own-b", "own-b", "yes", 4, 1)
	if ok, code := claim(t, newReplica(), "own-b", "own-y"); !ok || code != 0 {
		t.Fatalf("filling own-b: charged %v, denial %d", ok, code)
	}
	node := builder.Node("own-x", builder.Ready(), builder.WithLabels("own-a", "yes", "own-b", "yes"))
	node.Finalizers = []string{ngv1alpha1.TerminationFinalizer}
	handler := func(c *budget.Claimer) *ngwebhook.DeleteHandler {
		return &ngwebhook.DeleteHandler{Client: env.Client, Reader: env.Client, Rule: deletionRule(c),
			Managed: labels.Everything(), Clock: clock.RealClock{}, Timeout: ngwebhook.DefaultDeleteTimeout}
	}

	var respB admission.Response
	var once sync.Once
	beforeGiveBack := func(obj client.Object) {
		if ndb, ok := obj.(*ngv1alpha1.NodeDisruptionBudget); ok && ndb.Name == "own-a" && !charges(ndb, "own-x") {
			once.Do(func() {
				if err := newReplica().Release(ctx, "own-b", "own-y"); err != nil {
					t.Error(err)
				}
				respB = handler(newReplica()).Handle(ctx, deleteRequest(t, node, false))
			})
		}
	}
	writesA := intercepted(t, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			beforeGiveBack(obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}})
	respA := handler(&budget.Claimer{Client: writesA, Reader: env.Client, Clock: clock.RealClock{}}).Handle(ctx, deleteRequest(t, node, false))

	if respA.Allowed || respA.Result == nil || respA.Result.Code != http.StatusTooManyRequests || !strings.Contains(respA.Result.Message, "own-b") {
		t.Fatalf("delete A = allowed %v, %+v; want own-b's 429", respA.Allowed, respA.Result)
	}
	if !respB.Allowed {
		t.Fatalf("delete B = %+v; want it admitted", respB.Result)
	}
	requireCharged(t, "own-a", "own-x")
	requireCharged(t, "own-b", "own-x")
}
