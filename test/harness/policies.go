package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// The install's ValidatingAdmissionPolicies (Options.InstallPolicies): those
// manifests/default renders, as kubectl kustomize renders them for
// kubectl apply -k, so that a harness cluster guards what the product
// guards, as the product guards it.

// PolicyManifests renders manifests/default, with the components of
// manifests/components named (e.g. managed-nodes), through kubectl
// kustomize, and returns its ValidatingAdmissionPolicies and their bindings.
func PolicyManifests(components ...string) ([]client.Object, error) {
	dir := filepath.Join(RepoRoot(), "manifests", "default")
	if len(components) > 0 {
		tmp, err := os.MkdirTemp("", "nodeguard-policies-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		manifests, err := filepath.Rel(tmp, filepath.Join(RepoRoot(), "manifests")) // kustomize refuses absolute paths
		if err != nil {
			return nil, err
		}
		k := "resources:\n- " + filepath.Join(manifests, "default") + "\ncomponents:\n"
		for _, c := range components {
			k += "- " + filepath.Join(manifests, "components", c) + "\n"
		}
		if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			return nil, err
		}
		dir = tmp
	}
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w\n%s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("kubectl kustomize manifests/default with %v: %w", components, err)
	}
	var objs []client.Object
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, err
		}
		var obj client.Object
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicy{}
		case "ValidatingAdmissionPolicyBinding":
			obj = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		default:
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("%s: %w", meta.Kind, err)
		}
		objs = append(objs, obj)
	}
	if len(objs) < 2 {
		return nil, fmt.Errorf("manifests/default with %v renders %d admission policies and bindings, want at least the protected fields' two", components, len(objs))
	}
	return objs, nil
}

// installPolicies creates the install's policies and bindings, binds
// NodeOperator's role, and waits until kube-apiserver enforces them.
func (e *Env) installPolicies(ctx context.Context, components []string) error {
	objs, err := PolicyManifests(components...)
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nodeguard-harness-node-operator"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"get", "update", "patch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: NodeOperator}}}
	for _, obj := range append(objs, role, binding) {
		if err := e.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
	}
	return e.waitPoliciesEnforced(ctx)
}

// waitPoliciesEnforced waits until kube-apiserver, which loads a new policy
// a moment after it is created, refuses NodeOperator a dry run of what the
// protected fields' policy guards: a node created with a NodeClaim owner
// reference (only Karpenter adds one).
func (e *Env) waitPoliciesEnforced(ctx context.Context) error {
	operator, err := e.AsUser(NodeOperator)
	if err != nil {
		return err
	}
	var last error
	err = PollEvery(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		last = operator.Create(ctx, ClaimedNode("nodeguard-harness-policy-probe"), client.DryRunAll)
		return IsRefusedByPolicy(last), nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver does not enforce the install's admission policies (a node created with a NodeClaim owner reference, as %s: %v): %w", NodeOperator, last, err)
	}
	return nil
}

// ClaimedNode is a node that a NodeClaim owns, as Karpenter registers it:
// only Karpenter may create it or add the reference (the protected fields'
// policy).
func ClaimedNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{NodeClaimOwner(name)}}}
}

// NodeClaimOwner is an owner reference to a NodeClaim named name (which need
// not exist).
func NodeClaimOwner(name string) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: name, UID: types.UID("00000000-0000-4000-8000-00000000c1a1")}
}

// IsRefusedByPolicy says whether err is a refusal by a
// ValidatingAdmissionPolicy (not by RBAC or a webhook).
func IsRefusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
}
