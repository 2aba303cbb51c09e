package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The NetworkPolicy's webhook sources: the default (pods in kube-system, how
// the API server reaches webhooks on AKS), an added ipBlock (the component
// webhook-from-cidr), or no policy (without-networkpolicy) render the same
// from Helm values and from kustomize.
func TestNetworkPolicyRendersTheComponents(t *testing.T) {
	for _, tc := range []struct {
		values, component string
	}{{`
networkPolicy:
  webhookFrom:
  - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
  - ipBlock: {cidr: 10.224.0.0/16}
`, "webhook-from-cidr"}, {`
networkPolicy: {enabled: false}
`, "without-networkpolicy"}} {
		t.Run(tc.component, func(t *testing.T) {
			compare(t, render(t, "uninstallHook: {enabled: false}\n"+tc.values), kustomizeWith(t, tc.component))
		})
	}
}

// webhook.clientCAConfigMap renders what the component webhook-client-ca
// adds: --webhook-client-ca and the ConfigMap's volume.
func TestClientCARendersTheWebhookClientCAComponent(t *testing.T) {
	compare(t, render(t, "uninstallHook: {enabled: false}\nwebhook: {clientCAConfigMap: nodeguard-webhook-client-ca}\n"), kustomizeWith(t, "webhook-client-ca"))
	if args := fmt.Sprint(dig(deployment(t, render(t, "")), "spec", "template", "spec", "containers", 0, "args")); strings.Contains(args, "--webhook-client-ca") {
		t.Errorf("by default the chart sets --webhook-client-ca: %s", args)
	}
}

// The default NetworkPolicy admits only pods in kube-system to the webhook
// port, and leaves metrics and probes open.
func TestNetworkPolicyAdmitsOnlyTheAPIServerToTheWebhook(t *testing.T) {
	for what, objs := range map[string]map[string]object{"chart": render(t, ""), "kustomize": kustomize(t, "default")} {
		np, ok := objs["NetworkPolicy "+namespace+"/nodeguard"]
		if !ok {
			t.Errorf("%s: no NetworkPolicy rendered by default", what)
			continue
		}
		if got := dig(np, "spec", "podSelector", "matchLabels", "app.kubernetes.io/name"); got != "nodeguard" {
			t.Errorf("%s: the NetworkPolicy selects %v, want nodeguard's pods", what, dig(np, "spec", "podSelector"))
		}
		ports := map[float64]any{} // port → its rule's from
		rules, _ := dig(np, "spec", "ingress").([]any)
		for _, r := range rules {
			for _, p := range dig(r, "ports").([]any) {
				ports[dig(p, "port").(float64)] = dig(r, "from")
			}
		}
		webhookFrom := asJSON(ports[9443])
		if !strings.Contains(webhookFrom, `"kubernetes.io/metadata.name": "kube-system"`) || strings.Contains(webhookFrom, "ipBlock") {
			t.Errorf("%s: the webhook port admits %s, want pods in kube-system only", what, webhookFrom)
		}
		for _, open := range []float64{8443, 8081} {
			if from, ok := ports[open]; !ok || from != nil {
				t.Errorf("%s: port %v: from %v, want open to every source", what, open, from)
			}
		}
	}
}

// deploymentWrites lists the write verbs on Deployments that the roles of
// nodeguard grant (not the uninstall hook's, which may scale nodeguard's own
// Deployment only).
func deploymentWrites(objs map[string]object) []string {
	var out []string
	for k, o := range objs {
		if (o["kind"] != "ClusterRole" && o["kind"] != "Role") || dig(o, "metadata", "annotations", "helm.sh/hook") != nil {
			continue
		}
		rules, _ := dig(o, "rules").([]any)
		for _, r := range rules {
			if res, _ := dig(r, "resources").([]any); !slices.Contains(res, any("deployments")) {
				continue
			}
			for _, v := range dig(r, "verbs").([]any) {
				if v != "get" && v != "list" && v != "watch" {
					out = append(out, fmt.Sprintf("%s: %v deployments", k, v))
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// Patch on Deployments (any pod as any ServiceAccount) is granted only with
// --blocked-pdb-policy=replace: the chart's nodeguard.blockedPDBPolicy and
// the kustomize component blocked-pdb-replace render the same flag and grant,
// and the defaults neither.
func TestDeploymentPatchOnlyWithBlockedPDBReplace(t *testing.T) {
	compare(t, render(t, "uninstallHook: {enabled: false}\nnodeguard: {blockedPDBPolicy: replace}\n"), kustomizeWith(t, "blocked-pdb-replace"))
	for what, objs := range map[string]map[string]object{"chart": render(t, ""), "kustomize": kustomize(t, "default")} {
		if got := deploymentWrites(objs); len(got) > 0 {
			t.Errorf("%s, by default: nodeguard may write Deployments: %v", what, got)
		}
		if args := fmt.Sprint(dig(deployment(t, objs), "spec", "template", "spec", "containers", 0, "args")); !strings.Contains(args, "--blocked-pdb-policy=wait") {
			t.Errorf("%s, by default: args %s lack --blocked-pdb-policy=wait", what, args)
		}
	}
	want := []string{"ClusterRole /nodeguard-replace-deployments: patch deployments"}
	if got := deploymentWrites(render(t, "nodeguard: {blockedPDBPolicy: replace}\n")); !slices.Equal(got, want) {
		t.Errorf("with blockedPDBPolicy replace: Deployment writes %v, want %v", got, want)
	}
}

// deleteTimeouts returns the timeoutSeconds of every webhook that sees a
// DELETE or an eviction (each decided within --delete-admission-timeout), and
// nodeguard's --delete-admission-timeout.
func deleteTimeouts(t *testing.T, objs map[string]object) (webhooks map[string]time.Duration, flag time.Duration) {
	t.Helper()
	webhooks = map[string]time.Duration{}
	for _, o := range objs {
		if o["kind"] != "ValidatingWebhookConfiguration" && o["kind"] != "MutatingWebhookConfiguration" {
			continue
		}
		for _, wh := range dig(o, "webhooks").([]any) {
			for _, r := range dig(wh, "rules").([]any) {
				if slices.Contains(dig(r, "operations").([]any), any("DELETE")) || slices.Contains(dig(r, "resources").([]any), any("pods/eviction")) {
					secs, _ := dig(wh, "timeoutSeconds").(float64)
					webhooks[dig(wh, "name").(string)] = time.Duration(secs) * time.Second
				}
			}
		}
	}
	for _, a := range dig(deployment(t, objs), "spec", "template", "spec", "containers", 0, "args").([]any) {
		if v, ok := strings.CutPrefix(a.(string), "--delete-admission-timeout="); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("--delete-admission-timeout=%s: %v", v, err)
			}
			flag = d
		}
	}
	return webhooks, flag
}

// One value, webhook.timeoutSeconds, sets the timeoutSeconds of every DELETE
// webhook and of the eviction webhook, and nodeguard's
// --delete-admission-timeout 1s below it, so the API server never gives up
// before nodeguard answers (for an eviction, failurePolicy Ignore would admit
// what nodeguard refuses); kustomize ships the same pair for the default of 5.
func TestOneValueSetsBothDeleteTimeouts(t *testing.T) {
	for what, tc := range map[string]struct {
		objs    map[string]object
		timeout time.Duration
	}{
		"kustomize":         {kustomize(t, "default"), 5 * time.Second},
		"chart":             {render(t, ""), 5 * time.Second},
		"chart, timeout 12": {render(t, "webhook: {timeoutSeconds: 12}\n"), 12 * time.Second},
		"chart, timeout 2":  {render(t, "webhook: {timeoutSeconds: 2}\n"), 2 * time.Second},
	} {
		webhooks, flag := deleteTimeouts(t, tc.objs)
		if len(webhooks) == 0 {
			t.Errorf("%s: no webhook sees DELETE", what)
		}
		for name, got := range webhooks {
			if got != tc.timeout {
				t.Errorf("%s: webhook %s timeoutSeconds %s, want %s", what, name, got, tc.timeout)
			}
		}
		if want := tc.timeout - time.Second; flag != want {
			t.Errorf("%s: --delete-admission-timeout %s, want %s (1s below the webhooks' timeoutSeconds)", what, flag, want)
		}
	}
	if _, err := renderErr(t, "webhook: {timeoutSeconds: 1}\n"); err == nil {
		t.Error("webhook.timeoutSeconds 1 leaves nodeguard no time: the schema must refuse it")
	}
}

// The uninstall hook may delete only the two webhook configurations its
// release installed, by name, which are the ones its Job names.
func TestUninstallHookDeletesOnlyItsOwnWebhookConfigurations(t *testing.T) {
	objs := render(t, "fullnameOverride: guard\n")
	role := objs["ClusterRole /guard-uninstall"]
	args := fmt.Sprint(dig(objs["Job "+namespace+"/guard-uninstall"], "spec", "template", "spec", "containers", 0, "args"))
	found := 0
	for _, r := range dig(role, "rules").([]any) {
		if dig(r, "apiGroups", 0) != "admissionregistration.k8s.io" || dig(r, "resources", 0) == "validatingadmissionpolicybindings" {
			continue // the policy bindings: TestUninstallHookDeletesOnlyItsOwnPolicyBindings
		}
		found++
		names, _ := dig(r, "resourceNames").([]any)
		if len(names) != 1 || fmt.Sprint(dig(r, "verbs")) != "[delete]" {
			t.Errorf("the hook's rule on %v: resourceNames %v, verbs %v; want delete on one name", dig(r, "resources"), names, dig(r, "verbs"))
			continue
		}
		if !strings.Contains(args, "-webhook-configuration="+names[0].(string)) {
			t.Errorf("the hook may delete %v, which its Job (%s) does not name", names[0], args)
		}
	}
	if found != 2 {
		t.Errorf("the hook has %d rules on webhook configurations, want 2 (mutating, validating)", found)
	}
	// Everything else it needs outside nodes is namespaced: nodeguard's own
	// Deployment (by name) and pods, and the records in kube-node-maintenance.
	for _, r := range dig(role, "rules").([]any) {
		if g := dig(r, "apiGroups", 0); g != "admissionregistration.k8s.io" && fmt.Sprint(dig(r, "resources")) != "[nodes]" {
			t.Errorf("the hook's ClusterRole grants %v on %v cluster-wide", dig(r, "verbs"), dig(r, "resources"))
		}
	}
	scale := objs["Role "+namespace+"/guard-uninstall"]
	if got := asJSON(dig(scale, "rules", 0)); !strings.Contains(got, `"deployments"`) || !strings.Contains(got, `"resourceNames": [
    "guard"
  ]`) {
		t.Errorf("the hook's Role in %s: %s, want get and patch on Deployment guard only", namespace, got)
	}
	if _, ok := objs["RoleBinding kube-node-maintenance/guard-uninstall"]; !ok {
		t.Error("the hook cannot list the load-balancer records in kube-node-maintenance")
	}
}
