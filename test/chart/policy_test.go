package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// protectedFieldsPolicies are the ValidatingAdmissionPolicies and bindings
// rendered, by key.
func protectedFieldsPolicies(objs map[string]object) []string {
	var out []string
	for k, o := range objs {
		if o["kind"] == "ValidatingAdmissionPolicy" || o["kind"] == "ValidatingAdmissionPolicyBinding" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// The policies guarding the node fields nodeguard trusts: on by default in
// both (TestDefaultValuesRenderTheKustomizeBase compares them), off with
// protectedFields.enabled false as with the component
// without-protected-fields, the managed-label policy with the managed-nodes
// component's selector as with that component.
func TestProtectedFieldsRenderThePolicyComponents(t *testing.T) {
	const managed = "nodeguard: {managedNodes: {matchLabels: {nodeguard.io/managed: \"true\"}}}\n"
	compare(t, render(t, "uninstallHook: {enabled: false}\nprotectedFields: {enabled: false}\n"), kustomizeWith(t, "without-protected-fields"))
	compare(t, render(t, "uninstallHook: {enabled: false}\nprotectedFields: {enabled: false}\n"+managed),
		kustomizeWith(t, "managed-nodes", "without-protected-fields"))
	for what, tc := range map[string]struct {
		objs map[string]object
		want []string
	}{
		"chart":                    {render(t, ""), []string{"ValidatingAdmissionPolicy /nodeguard-protected-fields", "ValidatingAdmissionPolicyBinding /nodeguard-protected-fields"}},
		"kustomize":                {kustomize(t, "default"), []string{"ValidatingAdmissionPolicy /nodeguard-protected-fields", "ValidatingAdmissionPolicyBinding /nodeguard-protected-fields"}},
		"chart, managed nodes":     {render(t, managed), []string{"ValidatingAdmissionPolicy /nodeguard-managed-nodes", "ValidatingAdmissionPolicy /nodeguard-protected-fields", "ValidatingAdmissionPolicyBinding /nodeguard-managed-nodes", "ValidatingAdmissionPolicyBinding /nodeguard-protected-fields"}},
		"kustomize, managed nodes": {kustomizeWith(t, "managed-nodes"), []string{"ValidatingAdmissionPolicy /nodeguard-managed-nodes", "ValidatingAdmissionPolicy /nodeguard-protected-fields", "ValidatingAdmissionPolicyBinding /nodeguard-managed-nodes", "ValidatingAdmissionPolicyBinding /nodeguard-protected-fields"}},
	} {
		if got := protectedFieldsPolicies(tc.objs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: policies %v, want %v", what, got, tc.want)
		}
		for _, k := range tc.want {
			if strings.HasPrefix(k, "ValidatingAdmissionPolicyBinding ") {
				if got := fmt.Sprint(dig(tc.objs[k], "spec", "validationActions")); got != "[Deny]" {
					t.Errorf("%s: %s validationActions %s, want [Deny]", what, k, got)
				}
			}
		}
	}
}

// variable returns the expression of a policy's variable.
func variable(t *testing.T, policy object, name string) string {
	t.Helper()
	for _, v := range dig(policy, "spec", "variables").([]any) {
		if dig(v, "name") == name {
			return dig(v, "expression").(string)
		}
	}
	t.Fatalf("policy %v has no variable %s", dig(policy, "metadata", "name"), name)
	return ""
}

// nodeguard's identity follows the release (namespace and fullname), and the
// identities of the values become the policies' lists; a general
// nodeguard.managedNodes becomes CEL of the same selector.
func TestProtectedFieldsFollowTheValues(t *testing.T) {
	objs := render(t, `
fullnameOverride: guard
protectedFields:
  karpenterUsers: [system:serviceaccount:karpenter:karpenter, aks-node-provisioner]
  managedLabelRemovers: [system:serviceaccount:platform:labeller]
nodeguard:
  managedNodes:
    matchLabels: {pool: web}
    matchExpressions:
    - {key: zone, operator: In, values: [a, b]}
    - {key: tier, operator: NotIn, values: [batch]}
    - {key: gpu, operator: DoesNotExist}
    - {key: kubernetes.azure.com/agentpool, operator: Exists}
`)
	fields := objs["ValidatingAdmissionPolicy /guard-protected-fields"]
	if got, want := variable(t, fields, "nodeguard"), `"system:serviceaccount:`+namespace+`:guard"`; got != want {
		t.Errorf("nodeguard's identity %s, want %s", got, want)
	}
	if got, want := variable(t, fields, "karpenter"), `["system:serviceaccount:karpenter:karpenter","aks-node-provisioner"]`; got != want {
		t.Errorf("Karpenter's identities %s, want %s", got, want)
	}
	if got := dig(objs["ValidatingAdmissionPolicyBinding /guard-protected-fields"], "spec", "policyName"); got != "guard-protected-fields" {
		t.Errorf("the binding binds %v", got)
	}
	labels := objs["ValidatingAdmissionPolicy /guard-managed-nodes"]
	if got, want := variable(t, labels, "labelRemovers"), `["system:serviceaccount:platform:labeller"]`; got != want {
		t.Errorf("label removers %s, want %s", got, want)
	}
	const want = `has(object.metadata.labels) && ("pool" in object.metadata.labels && object.metadata.labels["pool"] == "web")` +
		` && ("zone" in object.metadata.labels && object.metadata.labels["zone"] in ["a","b"])` +
		` && !("tier" in object.metadata.labels && object.metadata.labels["tier"] in ["batch"])` +
		` && !("gpu" in object.metadata.labels) && "kubernetes.azure.com/agentpool" in object.metadata.labels`
	if got := variable(t, labels, "managedAfter"); got != want {
		t.Errorf("managedAfter:\n%s\nwant\n%s", got, want)
	}
	if got := variable(t, labels, "managedBefore"); got != strings.ReplaceAll(want, "object.", "oldObject.") {
		t.Errorf("managedBefore %s, want managedAfter's on oldObject", got)
	}
	msg := dig(labels, "spec", "validations", 0, "messageExpression").(string)
	if !strings.Contains(msg, "the labels pool, zone, tier, gpu, kubernetes.azure.com/agentpool (metadata.labels)") {
		t.Errorf("the refusal does not name the labels: %s", msg)
	}
	for _, values := range []string{
		"protectedFields: {karpenterUsers: [\"it's\"]}\n",
		"protectedFields: {managedLabelRemovers: [\"\"]}\n",
		"protectedFields: {karpenterUsers: system:serviceaccount:kube-system:karpenter}\n",
	} {
		if _, err := renderErr(t, values); err == nil || !strings.Contains(err.Error(), "/protectedFields/") {
			t.Errorf("installing with %q: %v, want the schema to refuse it", values, err)
		}
	}
}

// The uninstall hook may delete only the policy bindings of its release, by
// name, which are the ones its Job names: none when the policies are off.
func TestUninstallHookDeletesOnlyItsOwnPolicyBindings(t *testing.T) {
	for values, want := range map[string][]string{
		"fullnameOverride: guard\n": {"guard-protected-fields"},
		"fullnameOverride: guard\nnodeguard: {managedNodes: {matchLabels: {nodeguard.io/managed: \"true\"}}}\n": {"guard-protected-fields", "guard-managed-nodes"},
		"fullnameOverride: guard\nprotectedFields: {enabled: false}\n":                                          nil,
	} {
		objs := render(t, values)
		var names []string
		for _, r := range dig(objs["ClusterRole /guard-uninstall"], "rules").([]any) {
			if dig(r, "resources", 0) != "validatingadmissionpolicybindings" {
				continue
			}
			if fmt.Sprint(dig(r, "verbs")) != "[delete]" {
				t.Errorf("%s: the hook's rule on policy bindings grants %v, want delete", values, dig(r, "verbs"))
			}
			for _, n := range dig(r, "resourceNames").([]any) {
				names = append(names, n.(string))
			}
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s: the hook may delete the bindings %v, want %v", values, names, want)
		}
		args := fmt.Sprint(dig(objs["Job "+namespace+"/guard-uninstall"], "spec", "template", "spec", "containers", 0, "args"))
		if flag := "--admission-policy-bindings=" + strings.Join(want, ","); !strings.Contains(args, flag+" ") && !strings.HasSuffix(args, flag+"]") {
			t.Errorf("%s: the Job's args %s lack %s", values, args, flag)
		}
	}
}
