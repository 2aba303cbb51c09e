package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestClusterEnforcesTheInstallsPolicies: the e2e cluster runs the install's
// ValidatingAdmissionPolicies (harness.Options.InstallPolicies), enforced:
// an operator allowed to patch nodes may label one but not add a NodeClaim
// owner reference to it (only Karpenter may), the cluster admin may not
// remove nodeguard's finalizer, and nodeguard's ServiceAccount (as the
// tests' nodeguard runs) may.
func TestClusterEnforcesTheInstallsPolicies(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	const policy = "nodeguard-protected-fields"
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := env.Client.Get(ctx, client.ObjectKey{Name: policy}, &vap); err != nil {
		t.Fatalf("the install's policy %s: %v", policy, err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: policy}, &binding); err != nil || binding.Spec.PolicyName != policy {
		t.Fatalf("the binding %s of the install's policy: %v (policy %q)", policy, err, binding.Spec.PolicyName)
	}

	name := freshName("policy-probe")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{ngv1alpha1.TerminationFinalizer}}}
	harness.MustCreate(t, env.Client, node)
	t.Cleanup(func() {
		_ = env.AsNodeguard.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null,"ownerReferences":null}}`)))
		_ = env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	operator, err := env.AsUser(harness.NodeOperator)
	if err != nil {
		t.Fatal(err)
	}
	patch := func(c client.Client, p string) error {
		return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(p)))
	}

	if err := patch(operator, `{"metadata":{"labels":{"e2e-policy":"labelled"}}}`); err != nil {
		t.Fatalf("%s labels a node: %v, want admitted", harness.NodeOperator, err)
	}
	owner := harness.NodeClaimOwner(name)
	err = patch(operator, `{"metadata":{"ownerReferences":[{"apiVersion":"`+owner.APIVersion+`","kind":"NodeClaim","name":"`+name+`","uid":"`+string(owner.UID)+`"}]}}`)
	if !harness.IsRefusedByPolicy(err) || !strings.Contains(err.Error(), "NodeClaim") {
		t.Errorf("%s adds a NodeClaim owner reference to a node: %v, want refused by the policy %s", harness.NodeOperator, err, policy)
	}
	if err := patch(env.Client, `{"metadata":{"finalizers":null}}`); !harness.IsRefusedByPolicy(err) || !strings.Contains(err.Error(), ngv1alpha1.TerminationFinalizer) {
		t.Errorf("the cluster admin removes nodeguard's finalizer: %v, want refused by the policy %s", err, policy)
	}
	if err := patch(env.AsNodeguard, `{"metadata":{"finalizers":null}}`); err != nil {
		t.Errorf("nodeguard's ServiceAccount removes its finalizer: %v, want admitted", err)
	}
	var got corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) > 0 || slices.Contains(got.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Errorf("node %s: owner references %v, finalizers %v; want neither", name, got.OwnerReferences, got.Finalizers)
	}
}
