// Package e2e runs nodeguard's binary against the full local cluster
// (kube-apiserver, kube-controller-manager, kube-scheduler, kwok) and the ARM
// emulator, and checks what a user relies on when a node is deleted.
package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nodeguard/nodeguard/test/harness"
)

var (
	env       *harness.Env
	nodeguard string // the binary under test
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodeguard-e2e-")
	if err != nil {
		panic(err)
	}
	nodeguard = filepath.Join(dir, "nodeguard")
	code := 1
	if out, err := exec.Command("go", "build", "-o", nodeguard, "github.com/nodeguard/nodeguard/cmd/nodeguard").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
	} else {
		code = harness.Run(m, harness.Options{
			Cluster:          true,
			WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
		}, &env)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}
