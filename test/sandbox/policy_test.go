package main

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeguard/nodeguard/test/harness"
)

// TestSandboxRunsTheInstallsPolicies: make run's cluster has the install's
// ValidatingAdmissionPolicy and its binding, as a reader lists them, and
// nodeguard runs there as its ServiceAccount.
func TestSandboxRunsTheInstallsPolicies(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const policy = "nodeguard-protected-fields"
	for _, kind := range []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"} {
		out := harness.MustKubectl(t, env.Kubeconfig, "", "get", kind, "-o", "name")
		if !strings.Contains(out, "/"+policy+"\n") {
			t.Errorf("kubectl get %s in the sandbox:\n%s\nwant %s", kind, out, policy)
		}
	}
	var kubeconfig string
	for _, arg := range nodeguardArgs(config{}, env, "http://127.0.0.1:1") {
		if v, ok := strings.CutPrefix(arg, "--kubeconfig="); ok {
			kubeconfig = v
		}
	}
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatalf("nodeguard's --kubeconfig %q: %v", kubeconfig, err)
	}
	for name, auth := range cfg.AuthInfos {
		if auth.Impersonate != harness.NodeguardUser {
			t.Errorf("nodeguard's kubeconfig %s: user %s acts as %q, want %s", kubeconfig, name, auth.Impersonate, harness.NodeguardUser)
		}
	}
}
