package install

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	managedLabel = "nodeguard.io/managed"
	// karpenterUser is Karpenter's ServiceAccount as its chart installs it,
	// the identity manifests/policy names by default.
	karpenterUser = "system:serviceaccount:kube-system:karpenter"
	// karpenterElsewhere is Karpenter under a ServiceAccount and namespace
	// the policy names nowhere (AKS's karpenter-sa, a chart installed in its
	// own namespace): the policy knows it by its ClusterRole (karpenterRules).
	karpenterElsewhere = "system:serviceaccount:karpenter-ns:karpenter-custom"
	// labeller is the identity the test lets remove the managed label, in a
	// patch of the component managed-nodes as its policy's comment shows.
	labeller = "system:serviceaccount:platform:labeller"
	// operator may get, patch and update nodes, and nothing else: a
	// controller or person that cordons, taints and labels nodes.
	operator = "node-operator"
	// karpenterAdmin holds the ClusterRole Karpenter's chart aggregates to
	// admin (karpenterAdminRules), and may write nodes.
	karpenterAdmin = "karpenter-admin-user"
	// mark is a nodeguard.io annotation of a kind nodeguard does not write
	// yet: the policy guards the prefix, not a list.
	mark = "nodeguard.io/x-at"
)

// karpenterRules are the NodeClaim and Node rules of Karpenter's own
// ClusterRole, as its charts grant them (kubernetes-sigs/karpenter
// kwok/charts/templates/clusterrole.yaml, aws/karpenter-provider-aws and
// Azure/karpenter-provider-azure charts/karpenter/templates/clusterrole-core.yaml:
// karpenter.sh nodeclaims and nodeclaims/status create, delete, update, patch).
var karpenterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodepools", "nodepools/status", "nodeclaims", "nodeclaims/status"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodeclaims", "nodeclaims/status"}, Verbs: []string{"create", "delete", "update", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "create", "patch", "delete", "update"}},
}

// karpenterAdminRules are the NodeClaim rules of the ClusterRole Karpenter's
// charts aggregate to admin (templates/aggregate-clusterrole.yaml): patch,
// but not update, of nodeclaims/status.
var karpenterAdminRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodepools", "nodepools/status", "nodeclaims", "nodeclaims/status"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch"}},
}

// nodeWriterRules let a user create and write nodes and their status, as
// whoever manages nodes may: the policies, not RBAC, are what refuses them.
var nodeWriterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "create", "update", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get", "update", "patch"}},
}

// policyYAML builds manifests/default with the component managed-nodes,
// the label remover patched in, and returns its ValidatingAdmissionPolicies
// and their bindings as kustomize renders them.
func policyYAML(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := kustomizeWith(dir, "managed-nodes"); err != nil {
		t.Fatal(err)
	}
	k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k = append(k, []byte(`patches:
- target: {kind: ValidatingAdmissionPolicy, name: nodeguard-managed-nodes}
  patch: |-
    - op: replace
      path: /spec/variables/0/expression
      value: '["`+labeller+`"]'
`)...)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), k, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := kubectlKustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, doc := range strings.Split(out, "\n---\n") {
		if strings.Contains(doc, "\nkind: ValidatingAdmissionPolicy\n") || strings.Contains(doc, "\nkind: ValidatingAdmissionPolicyBinding\n") {
			docs = append(docs, doc)
		}
	}
	if len(docs) != 4 {
		t.Fatalf("manifests/default with managed-nodes renders %d policies and bindings, want 4 (protected fields, managed label)", len(docs))
	}
	return strings.Join(docs, "\n---\n")
}

// probeNode is a node the policies' enforcement is probed on, with dry runs.
const probeNode = "policy-probe"

// enforcedPolicies counts the policies that refuse, to the cluster admin, a
// dry run of what they guard: adding a nodeguard mark (protected fields; the
// admin may update NodeClaim status, so it passes for Karpenter), and
// removing the managed label (managed label). A dry run passes admission and
// writes nothing.
func enforcedPolicies(ctx context.Context) (int, error) {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: probeNode}, &n); err != nil {
		return 0, err
	}
	enforced := 0
	for _, patch := range []string{
		`{"metadata":{"annotations":{"nodeguard.io/policy-probe-at":"2000-01-01T00:00:00Z"}}}`,
		`{"metadata":{"labels":{"` + managedLabel + `":null}}}`,
	} {
		err := env.Client.Patch(ctx, n.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)), client.DryRunAll)
		switch {
		case err == nil:
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
			enforced++
		default:
			return 0, err
		}
	}
	return enforced, nil
}

// installPolicies applies the rendered policies and bindings and waits until
// the API server enforces them (it loads a new policy a moment later). Unless
// the test deletes the bindings itself, they go when it ends, and the test
// waits until they are no longer enforced, so that later tests write nodes
// freely.
func installPolicies(t *testing.T) {
	t.Helper()
	if err := env.Client.Create(context.Background(), builder.Node(probeNode, builder.WithLabels(managedLabel, "true"))); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rendered := policyYAML(t)
	harness.MustKubectl(t, env.Kubeconfig, rendered, "apply", "--server-side", "-f", "-")
	t.Cleanup(func() {
		harness.MustKubectl(t, env.Kubeconfig, rendered, "delete", "--ignore-not-found", "-f", "-")
		// Each policy stops on its own: wait for both, or a cleanup that
		// removes a guarded field meets the one still loaded.
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			n, err := enforcedPolicies(ctx)
			return n == 0, err
		}, "the deleted policies are no longer enforced")
	})
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		n, err := enforcedPolicies(ctx)
		return n == 2, err
	}, "the API server enforces the policies")
	// kube-apiserver type-checks each expression against the Node schema: a
	// warning is an expression that may fail at run time (failurePolicy Fail).
	for _, name := range []string{"nodeguard-protected-fields", "nodeguard-managed-nodes"} {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &p)
			return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil, err
		}, "the API server type-checks the policy %s", name)
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s, %s: %s", name, w.FieldRef, w.Warning)
		}
	}
}

// userClient is a client that impersonates the user.
func userClient(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append([]string{"system:authenticated"}, groups...)}
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serviceAccountGroups are the groups kube-apiserver gives the ServiceAccount
// user (system:serviceaccount:NS:NAME), for impersonating it.
func serviceAccountGroups(user string) []string {
	ns := strings.Split(user, ":")[2]
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}
}

// grant binds a ClusterRole of the rules, named name, to the users
// (ServiceAccount usernames become ServiceAccount subjects).
func grant(t *testing.T, name string, rules []rbacv1.PolicyRule, users ...string) {
	t.Helper()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	for _, u := range users {
		if sa, ok := strings.CutPrefix(u, "system:serviceaccount:"); ok {
			ns, name, _ := strings.Cut(sa, ":")
			binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name})
			continue
		}
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u})
	}
	for _, obj := range []client.Object{role, binding} {
		if err := env.Client.Create(context.Background(), obj); apierrors.IsAlreadyExists(err) {
			_ = env.Client.Delete(context.Background(), obj)
			harness.MustCreate(t, env.Client, obj)
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// nodeWriters lets the users create and write nodes and their status.
func nodeWriters(t *testing.T, users ...string) {
	t.Helper()
	grant(t, "install-test-node-writers", nodeWriterRules, users...)
}

// policyTestLabel marks the test's nodes, for the cleanup: no case writes it.
const policyTestLabel = "install-test/policy"

// policyRuns numbers the runs of TestPolicyGuardsTheFieldsNodeguardTrusts in
// this process (-count=N), for fresh node names.
var policyRuns int

// isMark tells nodeguard's marks, which only nodeguard may write: every
// nodeguard.io annotation but the user's drain timeout, and nodeguard's
// cluster-autoscaler hold.
func isMark(key string) bool {
	if strings.HasPrefix(key, "nodeguard.io/") {
		return key != ngv1alpha1.DrainTimeoutAnnotation
	}
	return key == ngv1alpha1.DelayDeletionAnnotation
}

// TestPolicyGuardsTheFieldsNodeguardTrusts applies the ValidatingAdmissionPolicies of
// manifests/default and of the component managed-nodes to the API server,
// and writes nodes as the identities that meet them (impersonated, each
// allowed by RBAC to write nodes): only nodeguard removes its finalizer and
// writes its marks (the nodeguard.io annotations but drain-timeout, its
// cluster-autoscaler hold, the draining taint), but for the finalizer-added-at
// mark its mutating webhook adds to another user's update with the finalizer;
// only Karpenter, named or known by its permission to update NodeClaim
// status, adds its finalizer or a NodeClaim ownerReference; only the
// identities named remove the managed label. Each refusal names the field,
// and writes that touch none of these fields (a kubelet's status, a cordon,
// another label, taint, annotation or finalizer, the drain timeout) are
// admitted. Last, nodeguard's own webhook patches its finalizer and mark into
// an operator's and a kubelet's update, which the policy admits.
func TestPolicyGuardsTheFieldsNodeguardTrusts(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t) // nodeguard's ServiceAccount may patch nodes
	policyRuns++
	const (
		alice   = "alice"
		kubelet = "system:node:policy-kubelet"
	)
	nodeWriters(t, alice, "root-admin", karpenterUser, labeller, kubelet, karpenterAdmin)
	grant(t, "install-test-node-operator", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch", "update"}},
	}, operator)
	grant(t, "install-test-karpenter-core", karpenterRules, karpenterElsewhere)
	grant(t, "install-test-karpenter-admin", karpenterAdminRules, karpenterAdmin)
	ctx := context.Background()
	// Release what the refusals left once the bindings are deleted (cleanups
	// run last first: installPolicies' deletes them), as the break-glass of
	// docs/security.md does: nodeguard's marks and taint, which later tests'
	// nodeguard would act on, and the NodeClaim ownerReferences, whose
	// NodeClaims do not exist: the garbage collector would delete the nodes
	// under later tests.
	t.Cleanup(func() {
		var nodes corev1.NodeList
		if err := env.Client.List(ctx, &nodes, client.MatchingLabels{policyTestLabel: "true"}); err != nil {
			t.Error(err)
			return
		}
		for i := range nodes.Items {
			n := &nodes.Items[i]
			patch := client.MergeFrom(n.DeepCopy())
			n.Finalizers, n.OwnerReferences = nil, nil
			maps.DeleteFunc(n.Annotations, func(k, _ string) bool { return isMark(k) })
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, ngv1alpha1.IsDrainingTaint)
			if err := env.Client.Patch(ctx, n, patch); err != nil {
				t.Errorf("releasing %s with the bindings deleted: %v", n.Name, err)
			}
		}
	})
	installPolicies(t)
	karpenter := userClient(t, karpenterUser)
	nodeguard := userClient(t, serviceAccount, serviceAccountGroups(serviceAccount)...)
	claimRef := func(name string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: name, UID: types.UID("6c1f0e52-0000-4000-8000-" + fmt.Sprintf("%012d", policyRuns))}
	}
	const (
		markRefused  = " (metadata.annotations) on a node"
		taintRefused = "taint nodeguard.io/draining (spec.taints)"
	)
	draining := corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule}
	// chargedDrain is a cordoned node whose drain nodeguard charged.
	chargedDrain := func(n *corev1.Node) {
		n.Spec.Unschedulable = true
		withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2026-01-01T00:00:00Z")(n)
		withAnnotation(ngv1alpha1.DrainedByAnnotation, "system:serviceaccount:ops:drainer")(n)
	}
	// webhookPatched is what nodeguard's mutating webhook adds to an update
	// of a node that lacks its finalizer.
	webhookPatched := func(n *corev1.Node) {
		withFinalizers(ngv1alpha1.TerminationFinalizer)(n)
		withAnnotation(ngv1alpha1.FinalizerAddedAtAnnotation, "2026-01-01T00:00:01Z")(n)
	}

	for i, tc := range []struct {
		name string
		// user and groups write the node.
		user   string
		groups []string
		// before is the node as the admin creates it (nil: the user creates
		// it, after); Karpenter creates it, nodeguard adds its marks and
		// taint.
		before func(*corev1.Node)
		// after is the user's change; status writes the status subresource.
		after  func(*corev1.Node)
		status bool
		// wantRefused names the field of the refusal; empty: admitted.
		wantRefused string
	}{{
		name: "an ordinary user removes nodeguard's finalizer", user: alice,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withoutFinalizer(ngv1alpha1.TerminationFinalizer),
		wantRefused: "nodeguard.io/termination finalizer (metadata.finalizers)",
	}, {
		name: "a cluster-admin (system:masters) removes nodeguard's finalizer", user: "root-admin", groups: []string{"system:masters"},
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withoutFinalizer(ngv1alpha1.TerminationFinalizer),
		wantRefused: "nodeguard.io/termination finalizer (metadata.finalizers)",
	}, {
		name: "Karpenter removes nodeguard's finalizer", user: karpenterUser,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withoutFinalizer(ngv1alpha1.TerminationFinalizer),
		wantRefused: "nodeguard.io/termination finalizer (metadata.finalizers)",
	}, {
		name: "nodeguard removes its finalizer", user: serviceAccount,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withoutFinalizer(ngv1alpha1.TerminationFinalizer),
	}, {
		name: "an ordinary user removes another finalizer, nodeguard's stays", user: alice,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer, "example.com/other"), after: withoutFinalizer("example.com/other"),
	}, {
		name: "an ordinary user removes nodeguard's finalizer through the status subresource", user: alice, status: true,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withoutFinalizer(ngv1alpha1.TerminationFinalizer),
		wantRefused: "nodeguard.io/termination finalizer (metadata.finalizers)",
	}, {
		// nodeguard's marks, written by an operator that may patch nodes.
		name: "an operator marks a cordoned node drained (drain-charged-at)", user: operator,
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true }, after: withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2026-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.DrainChargedAtAnnotation + markRefused,
	}, {
		name: "an operator names a node's drainer (drained-by)", user: operator,
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true }, after: withAnnotation(ngv1alpha1.DrainedByAnnotation, "someone"),
		wantRefused: "annotation " + ngv1alpha1.DrainedByAnnotation + markRefused,
	}, {
		name: "an operator changes a drain's charge time", user: operator,
		before: chargedDrain, after: withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2020-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.DrainChargedAtAnnotation + markRefused,
	}, {
		name: "an operator removes a drained node's marks to free its budget slot", user: operator,
		before: chargedDrain,
		after: func(n *corev1.Node) {
			withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "")(n)
			withAnnotation(ngv1alpha1.DrainedByAnnotation, "")(n)
		},
		wantRefused: ngv1alpha1.DrainChargedAtAnnotation,
	}, {
		name: "an operator removes drained-by alone", user: operator,
		before: chargedDrain, after: withAnnotation(ngv1alpha1.DrainedByAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.DrainedByAnnotation + markRefused,
	}, {
		name: "an operator adds scale-down-claimed-at", user: operator,
		before: func(*corev1.Node) {}, after: withAnnotation(ngv1alpha1.ScaleDownClaimedAnnotation, "2026-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.ScaleDownClaimedAnnotation + markRefused,
	}, {
		name: "an operator removes scale-down-claimed-at", user: operator,
		before: withAnnotation(ngv1alpha1.ScaleDownClaimedAnnotation, "2026-01-01T00:00:00Z"), after: withAnnotation(ngv1alpha1.ScaleDownClaimedAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.ScaleDownClaimedAnnotation + markRefused,
	}, {
		name: "an operator adds nodeclaim-delete-charged-at", user: operator,
		before: func(*corev1.Node) {}, after: withAnnotation(ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, "2026-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.NodeClaimDeleteChargedAtAnnotation + markRefused,
	}, {
		name: "an operator removes nodeclaim-delete-charged-at", user: operator,
		before: withAnnotation(ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, "2026-01-01T00:00:00Z"), after: withAnnotation(ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.NodeClaimDeleteChargedAtAnnotation + markRefused,
	}, {
		name: "an operator adds a nodeguard.io mark of a kind nodeguard does not write yet", user: operator,
		before: func(*corev1.Node) {}, after: withAnnotation(mark, "2026-01-01T00:00:00Z"),
		wantRefused: "annotation " + mark + markRefused,
	}, {
		name: "an operator changes a nodeguard.io mark of a kind nodeguard does not write yet", user: operator,
		before: withAnnotation(mark, "2026-01-01T00:00:00Z"), after: withAnnotation(mark, "2020-01-01T00:00:00Z"),
		wantRefused: "annotation " + mark + markRefused,
	}, {
		name: "an operator removes nodeguard's cluster-autoscaler hold", user: operator,
		before: withAnnotation(ngv1alpha1.DelayDeletionAnnotation, ngv1alpha1.DelayDeletionValue), after: withAnnotation(ngv1alpha1.DelayDeletionAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.DelayDeletionAnnotation + markRefused,
	}, {
		name: "a cluster-admin (system:masters) removes a drain mark", user: "root-admin", groups: []string{"system:masters"},
		before: chargedDrain, after: withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.DrainChargedAtAnnotation + markRefused,
	}, {
		name: "an ordinary user removes a drain mark through the status subresource", user: alice, status: true,
		before: chargedDrain, after: withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.DrainChargedAtAnnotation + markRefused,
	}, {
		name: "Karpenter adds a drain mark", user: karpenterElsewhere, groups: serviceAccountGroups(karpenterElsewhere),
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true }, after: withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2026-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.DrainChargedAtAnnotation + markRefused,
	}, {
		name: "nodeguard charges a drain", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true }, after: chargedDrain,
	}, {
		name: "nodeguard gives a drain back", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: chargedDrain,
		after: func(n *corev1.Node) {
			withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "")(n)
			withAnnotation(ngv1alpha1.DrainedByAnnotation, "")(n)
		},
	}, {
		name: "nodeguard writes its other marks and its hold", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: func(*corev1.Node) {},
		after: func(n *corev1.Node) {
			for _, a := range []string{ngv1alpha1.ScaleDownClaimedAnnotation, ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, mark, ngv1alpha1.FinalizerAddedAtAnnotation} {
				withAnnotation(a, "2026-01-01T00:00:00Z")(n)
			}
			withAnnotation(ngv1alpha1.DelayDeletionAnnotation, ngv1alpha1.DelayDeletionValue)(n)
		},
	}, {
		name: "nodeguard removes its other marks and its hold", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: func(n *corev1.Node) {
			for _, a := range []string{ngv1alpha1.ScaleDownClaimedAnnotation, ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, mark} {
				withAnnotation(a, "2026-01-01T00:00:00Z")(n)
			}
			withAnnotation(ngv1alpha1.DelayDeletionAnnotation, ngv1alpha1.DelayDeletionValue)(n)
		},
		after: func(n *corev1.Node) {
			for _, a := range []string{ngv1alpha1.ScaleDownClaimedAnnotation, ngv1alpha1.NodeClaimDeleteChargedAtAnnotation, mark, ngv1alpha1.DelayDeletionAnnotation} {
				withAnnotation(a, "")(n)
			}
		},
	}, {
		// The draining taint.
		name: "an operator adds the draining taint", user: operator,
		before: func(*corev1.Node) {}, after: withTaint(draining),
		wantRefused: taintRefused,
	}, {
		name: "an operator removes the draining taint", user: operator,
		before: withTaint(draining), after: withoutTaint(ngv1alpha1.DrainingTaintKey),
		wantRefused: taintRefused,
	}, {
		name: "an operator changes the draining taint's effect", user: operator,
		before: withTaint(draining),
		after: func(n *corev1.Node) {
			withoutTaint(ngv1alpha1.DrainingTaintKey)(n)
			withTaint(corev1.Taint{Key: draining.Key, Value: draining.Value, Effect: corev1.TaintEffectPreferNoSchedule})(n)
		},
		wantRefused: taintRefused,
	}, {
		name: "an operator changes the draining taint's value", user: operator,
		before: withTaint(draining),
		after: func(n *corev1.Node) {
			withoutTaint(ngv1alpha1.DrainingTaintKey)(n)
			withTaint(corev1.Taint{Key: draining.Key, Value: "false", Effect: draining.Effect})(n)
		},
		wantRefused: taintRefused,
	}, {
		name: "nodeguard adds the draining taint", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true }, after: withTaint(draining),
	}, {
		name: "nodeguard removes the draining taint", user: serviceAccount, groups: serviceAccountGroups(serviceAccount),
		before: withTaint(draining), after: withoutTaint(ngv1alpha1.DrainingTaintKey),
	}, {
		// What stays the operator's.
		name: "an operator cordons and uncordons a node nodeguard marked", user: operator,
		before: func(n *corev1.Node) {
			withTaint(draining)(n)
			withAnnotation(ngv1alpha1.ScaleDownClaimedAnnotation, "2026-01-01T00:00:00Z")(n)
		},
		after: func(n *corev1.Node) { n.Spec.Unschedulable = !n.Spec.Unschedulable },
	}, {
		name: "an operator uncordons a drained node, nodeguard's marks stay", user: operator,
		before: func(n *corev1.Node) { chargedDrain(n); withTaint(draining)(n) },
		after:  func(n *corev1.Node) { n.Spec.Unschedulable = false },
	}, {
		name: "an operator adds another taint, annotation and label to a node nodeguard marked", user: operator,
		before: func(n *corev1.Node) { chargedDrain(n); withTaint(draining)(n) },
		after: func(n *corev1.Node) {
			withTaint(corev1.Taint{Key: "example.com/maintenance", Value: "true", Effect: corev1.TaintEffectNoSchedule})(n)
			withAnnotation("example.com/ticket", "OPS-1")(n)
			withLabel("example.com/rack", "r1")(n)
		},
	}, {
		name: "an operator sets the drain timeout", user: operator,
		before: func(*corev1.Node) {}, after: withAnnotation(ngv1alpha1.DrainTimeoutAnnotation, "30m"),
	}, {
		name: "an operator changes the drain timeout of a drained node", user: operator,
		before: func(n *corev1.Node) { chargedDrain(n); withAnnotation(ngv1alpha1.DrainTimeoutAnnotation, "30m")(n) },
		after:  withAnnotation(ngv1alpha1.DrainTimeoutAnnotation, "1h"),
	}, {
		name: "an operator removes the drain timeout", user: operator,
		before: withAnnotation(ngv1alpha1.DrainTimeoutAnnotation, "30m"), after: withAnnotation(ngv1alpha1.DrainTimeoutAnnotation, ""),
	}, {
		// nodeguard's mutating webhook adds its finalizer and, on an update,
		// finalizer-added-at to another user's request: the policy sees that
		// user write both. The last subtest sends such updates through the
		// webhook itself.
		name: "a kubelet's update that nodeguard's webhook gave its finalizer and finalizer-added-at", user: kubelet, groups: []string{"system:nodes"},
		before: func(*corev1.Node) {}, after: webhookPatched,
	}, {
		name: "a cluster-admin's update that nodeguard's webhook gave its finalizer and a new finalizer-added-at", user: "root-admin", groups: []string{"system:masters"},
		before: withAnnotation(ngv1alpha1.FinalizerAddedAtAnnotation, "2025-01-01T00:00:00Z"), after: webhookPatched,
	}, {
		name: "an operator sets finalizer-added-at on a node that has nodeguard's finalizer", user: operator,
		before: withFinalizers(ngv1alpha1.TerminationFinalizer), after: withAnnotation(ngv1alpha1.FinalizerAddedAtAnnotation, "2099-01-01T00:00:00Z"),
		wantRefused: "annotation " + ngv1alpha1.FinalizerAddedAtAnnotation + markRefused,
	}, {
		name: "an operator removes finalizer-added-at", user: operator,
		before: withAnnotation(ngv1alpha1.FinalizerAddedAtAnnotation, "2026-01-01T00:00:00Z"), after: withAnnotation(ngv1alpha1.FinalizerAddedAtAnnotation, ""),
		wantRefused: "annotation " + ngv1alpha1.FinalizerAddedAtAnnotation + markRefused,
	}, {
		name: "an operator adds nodeguard's finalizer, finalizer-added-at and a drain mark at once", user: operator,
		before: func(n *corev1.Node) { n.Spec.Unschedulable = true },
		after: func(n *corev1.Node) {
			webhookPatched(n)
			withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2026-01-01T00:00:00Z")(n)
		},
		wantRefused: ngv1alpha1.DrainChargedAtAnnotation,
	}, {
		// Karpenter's fields.
		name: "an ordinary user adds Karpenter's finalizer", user: alice,
		before: func(*corev1.Node) {}, after: withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer),
		wantRefused: "karpenter.sh/termination finalizer (metadata.finalizers)",
	}, {
		name: "an ordinary user creates a node with Karpenter's finalizer", user: alice,
		after:       withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer),
		wantRefused: "karpenter.sh/termination finalizer (metadata.finalizers)",
	}, {
		name: "an ordinary user adds a NodeClaim ownerReference", user: alice,
		before: func(*corev1.Node) {}, after: func(n *corev1.Node) { n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)} },
		wantRefused: "NodeClaim owner reference (metadata.ownerReferences",
	}, {
		name: "an operator (node patch, no NodeClaim rights) adds a NodeClaim ownerReference", user: operator,
		before: func(*corev1.Node) {}, after: func(n *corev1.Node) { n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)} },
		wantRefused: "NodeClaim owner reference (metadata.ownerReferences",
	}, {
		name: "an operator adds Karpenter's finalizer", user: operator,
		before: func(*corev1.Node) {}, after: withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer),
		wantRefused: "karpenter.sh/termination finalizer (metadata.finalizers)",
	}, {
		name: "a user with the Karpenter admin role (nodeclaims/status patch, not update) adds a NodeClaim ownerReference", user: karpenterAdmin,
		before: func(*corev1.Node) {}, after: func(n *corev1.Node) { n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)} },
		wantRefused: "NodeClaim owner reference (metadata.ownerReferences",
	}, {
		name: "an ordinary user points a NodeClaim ownerReference at another NodeClaim", user: alice,
		before:      func(n *corev1.Node) { n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)} },
		after:       func(n *corev1.Node) { n.OwnerReferences[0].Name += "-other" },
		wantRefused: "NodeClaim owner reference (metadata.ownerReferences",
	}, {
		name: "Karpenter (named) adds its finalizer and a NodeClaim ownerReference", user: karpenterUser,
		before: func(*corev1.Node) {},
		after: func(n *corev1.Node) {
			withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer)(n)
			n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
		},
	}, {
		name: "Karpenter under another ServiceAccount, with its chart's ClusterRole, adds its finalizer and a NodeClaim ownerReference",
		user: karpenterElsewhere, groups: serviceAccountGroups(karpenterElsewhere),
		before: func(*corev1.Node) {},
		after: func(n *corev1.Node) {
			withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer)(n)
			n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
		},
	}, {
		name: "Karpenter under another ServiceAccount creates a node with its finalizer and a NodeClaim ownerReference",
		user: karpenterElsewhere, groups: serviceAccountGroups(karpenterElsewhere),
		after: func(n *corev1.Node) {
			withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer)(n)
			n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
		},
	}, {
		// A cluster-admin may update NodeClaim status, as it may do anything
		// (impersonate Karpenter included).
		name: "a cluster-admin (system:masters) adds Karpenter's finalizer", user: "root-admin", groups: []string{"system:masters"},
		before: func(*corev1.Node) {}, after: withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer),
	}, {
		// The managed label.
		name: "an ordinary user removes the managed label", user: alice,
		before: withLabel(managedLabel, "true"), after: withLabel(managedLabel, ""),
		wantRefused: "label nodeguard.io/managed (metadata.labels)",
	}, {
		name: "an ordinary user sets the managed label false", user: alice,
		before: withLabel(managedLabel, "true"), after: withLabel(managedLabel, "false"),
		wantRefused: "label nodeguard.io/managed (metadata.labels)",
	}, {
		name: "the identity named removes the managed label", user: labeller,
		before: withLabel(managedLabel, "true"), after: withLabel(managedLabel, ""),
	}, {
		name: "an ordinary user adds the managed label", user: alice,
		before: func(*corev1.Node) {}, after: withLabel(managedLabel, "true"),
	}, {
		name: "an ordinary user changes another label of a node with every guarded field", user: alice,
		before: guardedNode(claimRef), after: withLabel("pool", "other"),
	}, {
		name: "a kubelet writes the status of a node with every guarded field", user: kubelet, groups: []string{"system:nodes"}, status: true,
		before: guardedNode(claimRef),
		after: func(n *corev1.Node) {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := userClient(t, tc.user, tc.groups...)
			name := fmt.Sprintf("policy%d-%d", policyRuns, i)
			node := builder.Node(name, builder.WithLabels("pool", "policy", policyTestLabel, "true"))
			var err error
			if tc.before == nil {
				tc.after(node)
				err = c.Create(ctx, node)
			} else {
				createAs(t, karpenter, nodeguard, node, tc.before)
				want := node.DeepCopy()
				tc.after(want)
				patch := client.MergeFrom(node) // no lock: kwok writes the status meanwhile
				if tc.status {
					err = c.Status().Patch(ctx, want, patch)
				} else {
					err = c.Patch(ctx, want, patch)
				}
			}
			if tc.wantRefused == "" {
				if err != nil {
					t.Fatalf("%s: refused: %v", tc.user, err)
				}
				if tc.before != nil {
					want := node.DeepCopy()
					tc.after(want)
					if tc.status {
						want.Spec = node.Spec // the status subresource keeps the spec
					}
					var got corev1.Node
					if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
						t.Fatal(err)
					}
					if g, w := guardedState(&got), guardedState(want); g != w {
						t.Errorf("the admitted write did not land:\n got %s\nwant %s", g, w)
					}
				}
				return
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.wantRefused) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
				t.Fatalf("%s: got %v, want a refusal by the policy naming %q", tc.user, err, tc.wantRefused)
			}
			t.Logf("refused: %v", err)
			if tc.before == nil {
				return
			}
			var got corev1.Node
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
				t.Fatal(err)
			}
			if g, w := guardedState(&got), guardedState(node); g != w {
				t.Errorf("the refused write changed the node:\n got %s\nwant %s", g, w)
			}
		})
	}

	t.Run("break-glass removes a stale drain mark and the draining taint as nodeguard", func(t *testing.T) {
		name := fmt.Sprintf("policy%d-break-glass", policyRuns)
		node := builder.Node(name, builder.WithLabels("pool", "policy", policyTestLabel, "true"))
		createAs(t, karpenter, nodeguard, node, func(n *corev1.Node) { chargedDrain(n); withTaint(draining)(n) })
		// The commands of docs/security.md#break-glass, as the cluster admin:
		// refused under its own name, done as nodeguard.
		for _, args := range [][]string{
			{"annotate", "node", name, ngv1alpha1.DrainChargedAtAnnotation + "-", ngv1alpha1.DrainedByAnnotation + "-"},
			{"taint", "node", name, ngv1alpha1.DrainingTaintKey + "-"},
		} {
			out, err := harness.Kubectl(env.Kubeconfig, "", args...)
			if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy") || !strings.Contains(out, "docs/security.md#break-glass") {
				t.Fatalf("kubectl %s as the cluster admin: %v, want a refusal by the policy\n%s", strings.Join(args, " "), err, out)
			}
			harness.MustKubectl(t, env.Kubeconfig, "", append(args, "--as="+serviceAccount)...)
		}
		var got corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		want := node.DeepCopy()
		withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "")(want)
		withAnnotation(ngv1alpha1.DrainedByAnnotation, "")(want)
		withoutTaint(ngv1alpha1.DrainingTaintKey)(want)
		if g, w := guardedState(&got), guardedState(want); g != w {
			t.Errorf("after the break-glass:\n got %s\nwant %s", g, w)
		}
	})

	t.Run("nodeguard's webhook adds its finalizer and finalizer-added-at to others' updates", func(t *testing.T) {
		webhookPatchesOthersUpdates(t, operator, kubelet)
	})
}

// createAs creates the node with the fields before gives it, as the policy
// lets them be written: the node as Karpenter (which may add its finalizer
// and a NodeClaim ownerReference), then nodeguard's marks and draining taint
// as nodeguard. node is left as the API server has it.
func createAs(t *testing.T, karpenter, nodeguard client.Client, node *corev1.Node, before func(*corev1.Node)) {
	t.Helper()
	ctx := context.Background()
	full := node.DeepCopy()
	before(full)
	before(node)
	maps.DeleteFunc(node.Annotations, func(k, _ string) bool { return isMark(k) })
	node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, ngv1alpha1.IsDrainingTaint)
	if err := karpenter.Create(ctx, node); err != nil {
		t.Fatalf("creating %s as Karpenter: %v", node.Name, err)
	}
	if guardedState(node) == guardedState(full) {
		return
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Annotations, node.Spec.Taints = full.Annotations, full.Spec.Taints
	if err := nodeguard.Patch(ctx, node, patch); err != nil {
		t.Fatalf("marking %s as nodeguard: %v", node.Name, err)
	}
}

// webhookPatchesOthersUpdates runs nodeguard (as its ServiceAccount, Azure
// off) for nodes with a label of the test's own, and has each user update a
// node without it so that it gets the label: nodeguard's mutating webhook
// adds its finalizer and nodeguard.io/finalizer-added-at to that update, and
// the policy, which sees the update after the webhook, admits it.
func webhookPatchesOthersUpdates(t *testing.T, operator, kubelet string) {
	const selected = "install-test/policy-webhook"
	ng := harness.StartNodeguard(t, env.Client, append([]string{
		"--kubeconfig=" + serviceAccountKubeconfig(t), "--health-probe-bind-address=0", "--metrics-bind-address=0",
		"--leader-elect=true", "--leader-election-namespace=" + namespace, "--leader-election-id=policy-webhook",
		"--azure-config=", "--node-selector=" + selected + "=true",
	}, env.WebhookArgs()...)...)
	if err := ng.WaitServing(env.WebhookAddr(), time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		user   string
		groups []string
		// update writes the whole node (PUT) rather than a patch.
		update bool
	}{{user: operator}, {user: kubelet, groups: []string{"system:nodes"}, update: true}} {
		name := fmt.Sprintf("policy%d-webhook-%s", policyRuns, strings.NewReplacer(":", "-").Replace(w.user))
		node := builder.Node(name, builder.WithLabels("pool", "policy", policyTestLabel, "true"))
		harness.MustCreate(t, env.Client, node) // not selected: the webhook leaves it alone
		if slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) {
			t.Fatalf("%s was created with nodeguard's finalizer, though nodeguard selects only %s=true", name, selected)
		}
		c := userClient(t, w.user, w.groups...)
		var err error
		harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
			var cur corev1.Node
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &cur); err != nil {
				return false, err
			}
			patch := client.MergeFrom(cur.DeepCopy())
			cur.Labels[selected] = "true"
			if w.update {
				err = c.Update(ctx, &cur)
			} else {
				err = c.Patch(ctx, &cur, patch)
			}
			if apierrors.IsConflict(err) { // kwok wrote the status meanwhile
				return false, nil
			}
			*node = cur
			return true, nil
		}, "%s updates %s", w.user, name)
		if err != nil {
			t.Fatalf("%s's update that nodeguard's webhook patched: refused: %v", w.user, err)
		}
		// The answer to the update is the node as stored by it: patched by the
		// webhook within the request, not by nodeguard afterwards.
		if !slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) || node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation] == "" {
			t.Fatalf("%s's update of %s was not patched by nodeguard's webhook: finalizers %v, annotations %v", w.user, name, node.Finalizers, node.Annotations)
		}
		t.Logf("%s's update admitted with the webhook's patch: finalizers %v, %s=%s", w.user, node.Finalizers,
			ngv1alpha1.FinalizerAddedAtAnnotation, node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation])
	}
}

func withFinalizers(fs ...string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, fs...) }
}

func withoutFinalizer(f string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Finalizers = slices.DeleteFunc(n.Finalizers, func(s string) bool { return s == f })
	}
}

// withLabel sets the label; the empty value removes it.
func withLabel(key, value string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		if value == "" {
			delete(n.Labels, key)
			return
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[key] = value
	}
}

// withAnnotation sets the annotation; the empty value removes it.
func withAnnotation(key, value string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		if value == "" {
			delete(n.Annotations, key)
			return
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = value
	}
}

func withTaint(taint corev1.Taint) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taint) }
}

func withoutTaint(key string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
	}
}

// guardedNode gives a node every field the policies guard.
func guardedNode(claimRef func(string) metav1.OwnerReference) func(*corev1.Node) {
	return func(n *corev1.Node) {
		withFinalizers(ngv1alpha1.TerminationFinalizer, ngv1alpha1.KarpenterTerminationFinalizer)(n)
		withLabel(managedLabel, "true")(n)
		n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
		n.Spec.Unschedulable = true
		withAnnotation(ngv1alpha1.DrainChargedAtAnnotation, "2026-01-01T00:00:00Z")(n)
		withAnnotation(ngv1alpha1.DelayDeletionAnnotation, ngv1alpha1.DelayDeletionValue)(n)
		withTaint(corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule})(n)
	}
}

// guardedState sums up what the cases write of a node: its finalizers,
// owners, nodeguard's and the test's labels, annotations and taints
// (example.com/*), and whether it is cordoned. Other writers' fields (kwok's,
// the node lifecycle controller's taints, the TTL controller's annotation)
// are left out.
func guardedState(n *corev1.Node) string {
	ours := func(k string) bool {
		return strings.HasPrefix(k, "nodeguard.io/") || strings.HasPrefix(k, "example.com/") || k == ngv1alpha1.DelayDeletionAnnotation || k == "pool"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "finalizers %v owners %v unschedulable %v", n.Finalizers, ownerNames(n.OwnerReferences), n.Spec.Unschedulable)
	for _, kv := range []struct {
		what string
		m    map[string]string
	}{{"labels", n.Labels}, {"annotations", n.Annotations}} {
		fmt.Fprintf(&b, " %s", kv.what)
		for _, k := range slices.Sorted(maps.Keys(kv.m)) {
			if ours(k) {
				fmt.Fprintf(&b, " %s=%s", k, kv.m[k])
			}
		}
	}
	b.WriteString(" taints")
	for _, t := range n.Spec.Taints {
		if ours(t.Key) {
			fmt.Fprintf(&b, " %s=%s:%s", t.Key, t.Value, t.Effect)
		}
	}
	return b.String()
}

func ownerNames(refs []metav1.OwnerReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Kind+"/"+r.Name)
	}
	return out
}
