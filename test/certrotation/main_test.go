// Package certrotation renews nodeguard's webhook serving certificate under a
// running kube-apiserver, with real cert-manager (controller and cainjector,
// built from cert-manager's module by hack/tools/certmanager) issuing it from
// the shipped manifests and injecting the CA, while node deletions are being
// admitted, and counts the admissions the API server refused.
package certrotation

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) {
	code := harness.Run(m, harness.Options{}, &env)
	for _, p := range certManagerProcesses {
		p.Kill()
	}
	os.Exit(code)
}

var (
	certManagerOnce      sync.Once
	certManagerErr       error
	certManagerProcesses []*harness.Nodeguard
)

// certManagerBinary is hack/tools/certmanager's build (make tools).
func certManagerBinary(t *testing.T) string {
	t.Helper()
	binary := filepath.Join(harness.BinDir(), "cert-manager")
	if _, err := os.Stat(binary); err != nil {
		t.Fatalf("%s is missing: run make tools: %v", binary, err)
	}
	return binary
}

// startCertManager installs cert-manager's CRDs and starts its controller
// against the control plane, once for the package.
func startCertManager(t *testing.T) {
	t.Helper()
	binary := certManagerBinary(t)
	certManagerOnce.Do(func() {
		crds := filepath.Join(harness.BinDir(), "cert-manager-crds")
		out, err := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "apply", "--server-side", "-f", crds).CombinedOutput()
		if err != nil {
			certManagerErr = fmt.Errorf("applying cert-manager's CRDs: %v\n%s", err, out)
			return
		}
		for _, crd := range []string{"certificates.cert-manager.io", "issuers.cert-manager.io", "certificaterequests.cert-manager.io"} {
			if err := harness.WaitForCRDEstablished(context.Background(), env.Client, crd); err != nil {
				certManagerErr = fmt.Errorf("waiting for cert-manager's CRDs: %w", err)
				return
			}
		}
		p, err := harness.StartNodeguardProcess(binary, filepath.Join(env.Dir, "cert-manager-controller.log"), "controller", "--kubeconfig="+env.Kubeconfig)
		if err != nil {
			certManagerErr = err
			return
		}
		certManagerProcesses = append(certManagerProcesses, p)
	})
	if certManagerErr != nil {
		t.Fatal(certManagerErr)
	}
	t.Cleanup(func() {
		if t.Failed() && len(certManagerProcesses) > 0 {
			t.Logf("cert-manager controller log (tail):\n%s", certManagerProcesses[0].LogTail(40))
		}
	})
}

// startCAInjector starts cert-manager's cainjector for the test. merging false
// is cainjector before cert-manager 1.19, which replaced a webhook's caBundle
// with the new CA instead of adding it to the CAs already there.
func startCAInjector(t *testing.T, merging bool) {
	t.Helper()
	p, err := harness.StartNodeguardProcess(certManagerBinary(t), filepath.Join(t.TempDir(), "cainjector.log"), "cainjector",
		"--kubeconfig="+env.Kubeconfig, fmt.Sprintf("--feature-gates=CAInjectorMerging=%t", merging))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("cert-manager cainjector log (tail):\n%s", p.LogTail(40))
		}
	})
}
