package e2e

import (
	"path/filepath"
	"testing"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	subscription  = "00000000-0000-0000-0000-000000000000"
	resourceGroup = "mc_e2e"
)

// startNodeguard runs the binary against the API server (through kubeconfig,
// an admin one, as nodeguard's ServiceAccount) and the ARM emulator, serving
// the installed webhooks.
func startNodeguard(t *testing.T, kubeconfig string, emu *armemulator.Server, extra ...string) *harness.Nodeguard {
	t.Helper()
	args := append([]string{"--kubeconfig=" + harness.AsNodeguardKubeconfig(t, kubeconfig), "--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false"},
		env.WebhookArgs()...)
	args = append(args, harness.EmulatorArgs(emu.URL(), subscription, resourceGroup)...)
	return harness.StartNodeguard(t, env.Client, append(args, extra...)...)
}

// startAPIProxy starts a recording proxy to the cluster for the test.
func startAPIProxy(t *testing.T) *harness.APIProxy {
	t.Helper()
	p, err := harness.StartAPIProxy(env.Config, filepath.Join(t.TempDir(), "proxy.Kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
