package chart

import (
	"fmt"
	"strings"
	"testing"
)

// TestWebhooksTrustTheCAThatSignsTheServingCertificate checks cert-manager's
// pattern for webhooks in the chart and in the kustomize base: the webhook
// configurations get the CA injected (inject-ca-from names a CA Certificate
// from a self-signed Issuer, whose key survives its renewal), and the serving
// certificate the Deployment mounts comes from a CA Issuer on that CA. So a
// renewed serving certificate is trusted as soon as it is served.
func TestWebhooksTrustTheCAThatSignsTheServingCertificate(t *testing.T) {
	for source, objs := range map[string]map[string]object{
		"chart":     render(t, ""),
		"kustomize": kustomize(t, "default"),
	} {
		t.Run(source, func(t *testing.T) {
			get := func(kind, name string) object {
				t.Helper()
				o, ok := objs[fmt.Sprintf("%s %s/%s", kind, namespace, name)]
				if !ok {
					t.Fatalf("no %s %s/%s", kind, namespace, name)
				}
				return o
			}
			var injected []string
			for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
				wh := objs[kind+" /nodeguard-"+strings.ToLower(strings.TrimSuffix(kind, "WebhookConfiguration"))+"-webhook-configuration"]
				from, _ := dig(wh, "metadata", "annotations", "cert-manager.io/inject-ca-from").(string)
				injected = append(injected, from)
			}
			if injected[0] != injected[1] || !strings.HasPrefix(injected[0], namespace+"/") {
				t.Fatalf("inject-ca-from of the webhooks: %q, want one Certificate in %s", injected, namespace)
			}
			ca := get("Certificate", strings.TrimPrefix(injected[0], namespace+"/"))
			if dig(ca, "spec", "isCA") != true {
				t.Errorf("the webhooks get the CA of %s injected, which is not a CA: the serving certificate's own CA changes with every renewal", injected[0])
			}
			if got := dig(ca, "spec", "privateKey", "rotationPolicy"); got != "Never" {
				t.Errorf("the CA's rotationPolicy is %v, want Never: a renewed CA with a new key would not verify serving certificates signed before", got)
			}
			if dig(get("Issuer", dig(ca, "spec", "issuerRef", "name").(string)), "spec", "selfSigned") == nil {
				t.Errorf("the CA is not issued by a self-signed Issuer")
			}
			deploy := get("Deployment", "nodeguard")
			mounted := dig(deploy, "spec", "template", "spec", "volumes", 0, "secret", "secretName")
			var serving object
			for k, o := range objs {
				if strings.HasPrefix(k, "Certificate ") && dig(o, "spec", "secretName") == mounted {
					serving = o
				}
			}
			if serving == nil {
				t.Fatalf("no Certificate writes the Secret %v the Deployment mounts", mounted)
			}
			issuer := get("Issuer", dig(serving, "spec", "issuerRef", "name").(string))
			if got := dig(issuer, "spec", "ca", "secretName"); got != dig(ca, "spec", "secretName") {
				t.Errorf("the serving certificate's Issuer signs with %v, want the CA's Secret %v", got, dig(ca, "spec", "secretName"))
			}
		})
	}
}

// TestMaintenanceNamespaceIsShipped: the chart and the manifests ship
// kube-node-maintenance, which nodeguard may not create; helm uninstall keeps
// it (other tools' Leases live there).
func TestMaintenanceNamespaceIsShipped(t *testing.T) {
	const key = "Namespace /kube-node-maintenance"
	if _, ok := kustomize(t, "default")[key]; !ok {
		t.Error("manifests/default does not ship the namespace kube-node-maintenance")
	}
	ns, ok := render(t, "")[key]
	if !ok {
		t.Fatal("the chart does not render the namespace kube-node-maintenance")
	}
	if got := dig(ns, "metadata", "annotations", "helm.sh/resource-policy"); got != "keep" {
		t.Errorf("helm.sh/resource-policy of kube-node-maintenance: %v, want keep", got)
	}
	if _, ok := render(t, "maintenanceNamespace: {create: false}")[key]; ok {
		t.Error("maintenanceNamespace.create=false still renders kube-node-maintenance")
	}
}
