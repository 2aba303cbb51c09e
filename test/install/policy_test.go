package install

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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
	// the identity manifests/policy trusts by default.
	karpenterUser = "system:serviceaccount:kube-system:karpenter"
	// labeller is the identity the test lets remove the managed label, in a
	// patch of the component managed-nodes as its policy's comment shows.
	labeller = "system:serviceaccount:platform:labeller"
)

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
// dry run of what they guard: adding Karpenter's finalizer (protected fields),
// and removing the managed label (managed label). A dry run passes admission
// and writes nothing.
func enforcedPolicies(ctx context.Context) (int, error) {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: probeNode}, &n); err != nil {
		return 0, err
	}
	enforced := 0
	for _, patch := range []string{
		`{"metadata":{"finalizers":["` + ngv1alpha1.KarpenterTerminationFinalizer + `"]}}`,
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

// nodeWriters lets the users create and write nodes and their status, as
// whoever manages nodes may: the policies, not RBAC, are what refuses them.
func nodeWriters(t *testing.T, users ...string) {
	t.Helper()
	const name = "install-test-node-writers"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "create", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get", "update", "patch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	for _, u := range users {
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

// policyTestLabel marks the test's nodes, for the cleanup: no case writes it.
const policyTestLabel = "install-test/policy"

// policyRuns numbers the runs of TestPolicyGuardsTheFieldsNodeguardTrusts in
// this process (-count=N), for fresh node names.
var policyRuns int

// TestPolicyGuardsTheFieldsNodeguardTrusts applies the ValidatingAdmissionPolicies of
// manifests/default and of the component managed-nodes to the API server,
// and writes nodes as the identities that meet them (impersonated, each
// allowed by RBAC to write nodes): only nodeguard removes its finalizer, only
// Karpenter adds its finalizer or a NodeClaim ownerReference, only the
// identities named remove the managed label; each refusal names the field,
// and writes that touch none of these fields (a kubelet's status, another
// label, another finalizer) are admitted.
func TestPolicyGuardsTheFieldsNodeguardTrusts(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t) // nodeguard's ServiceAccount may patch nodes
	policyRuns++
	const (
		alice   = "alice"
		kubelet = "system:node:policy-kubelet"
	)
	nodeWriters(t, alice, "root-admin", karpenterUser, labeller, kubelet)
	ctx := context.Background()
	// Release what the refusals left once the bindings are deleted (cleanups
	// run last first: installPolicies' deletes them), as the break-glass of
	// docs/security.md does; and drop the NodeClaim ownerReferences, whose
	// NodeClaims do not exist: the garbage collector would delete the nodes
	// under later tests.
	t.Cleanup(func() {
		var nodes corev1.NodeList
		if err := env.Client.List(ctx, &nodes, client.MatchingLabels{policyTestLabel: "true"}); err != nil {
			t.Error(err)
			return
		}
		for i := range nodes.Items {
			if len(nodes.Items[i].Finalizers) > 0 || len(nodes.Items[i].OwnerReferences) > 0 {
				if err := env.Client.Patch(ctx, &nodes.Items[i], client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null,"ownerReferences":null}}`))); err != nil {
					t.Errorf("releasing %s with the bindings deleted: %v", nodes.Items[i].Name, err)
				}
			}
		}
	})
	installPolicies(t)
	karpenter := userClient(t, karpenterUser)
	claimRef := func(name string) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: name, UID: types.UID("6c1f0e52-0000-4000-8000-" + fmt.Sprintf("%012d", policyRuns))}
	}

	for i, tc := range []struct {
		name string
		// user and groups write the node.
		user   string
		groups []string
		// before is the node as the admin creates it (nil: the user creates
		// it, after).
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
		name: "an ordinary user points a NodeClaim ownerReference at another NodeClaim", user: alice,
		before:      func(n *corev1.Node) { n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)} },
		after:       func(n *corev1.Node) { n.OwnerReferences[0].Name += "-other" },
		wantRefused: "NodeClaim owner reference (metadata.ownerReferences",
	}, {
		name: "Karpenter adds its finalizer and a NodeClaim ownerReference", user: karpenterUser,
		before: func(*corev1.Node) {},
		after: func(n *corev1.Node) {
			withFinalizers(ngv1alpha1.KarpenterTerminationFinalizer)(n)
			n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
		},
	}, {
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
				// Created as Karpenter, the one identity that may create a
				// node with every guarded field.
				tc.before(node)
				if err := karpenter.Create(ctx, node); err != nil {
					t.Fatalf("creating %s as Karpenter: %v", name, err)
				}
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
					var got corev1.Node
					if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got.Finalizers, want.Finalizers) || !slices.Equal(ownerNames(got.OwnerReferences), ownerNames(want.OwnerReferences)) ||
						got.Labels[managedLabel] != want.Labels[managedLabel] {
						t.Errorf("the admitted write did not land: finalizers %v, owners %v, labels %v", got.Finalizers, got.OwnerReferences, got.Labels)
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
			if !slices.Equal(got.Finalizers, node.Finalizers) || !slices.Equal(ownerNames(got.OwnerReferences), ownerNames(node.OwnerReferences)) ||
				got.Labels[managedLabel] != node.Labels[managedLabel] {
				t.Errorf("the refused write changed the node: finalizers %v, owners %v, labels %v", got.Finalizers, got.OwnerReferences, got.Labels)
			}
		})
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

// guardedNode gives a node every field the policies guard.
func guardedNode(claimRef func(string) metav1.OwnerReference) func(*corev1.Node) {
	return func(n *corev1.Node) {
		withFinalizers(ngv1alpha1.TerminationFinalizer, ngv1alpha1.KarpenterTerminationFinalizer)(n)
		withLabel(managedLabel, "true")(n)
		n.OwnerReferences = []metav1.OwnerReference{claimRef(n.Name)}
	}
}

func ownerNames(refs []metav1.OwnerReference) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Kind+"/"+r.Name)
	}
	return out
}
