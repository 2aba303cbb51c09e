package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// moduleLine opens the go.mod of the nodeguard module.
const moduleLine = "module github.com/nodeguard/nodeguard\n"

// RepoRoot is the root of the nodeguard repository, found from this file's
// path; in a -trimpath build (make's), which has no such path, from the
// working directory up to the nodeguard module's go.mod.
func RepoRoot() string {
	if _, file, _, _ := runtime.Caller(0); filepath.IsAbs(file) {
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}
	wd, _ := os.Getwd()
	for dir := wd; ; dir = filepath.Dir(dir) {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(mod), moduleLine) {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}

// BinDir is where make tools puts the control-plane binaries: $NODEGUARD_BIN_DIR,
// or bin/ in the repository.
func BinDir() string {
	if dir := os.Getenv("NODEGUARD_BIN_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(RepoRoot(), "bin")
}

// KubeVersionEnv selects the Kubernetes release of the control plane:
// unset for the newest supported (bin/), or OldestKubeVersion for the oldest,
// whose kube-apiserver, kube-controller-manager and kube-scheduler make
// tools-oldest builds side by side into bin/k8s-<version>/.
const KubeVersionEnv = "NODEGUARD_KUBE_VERSION"

// OldestKubeVersion is the oldest Kubernetes release nodeguard supports.
const OldestKubeVersion = "1.36"

// kubeVersion is the release of the control plane started here: "" for the
// newest.
func kubeVersion() string { return os.Getenv(KubeVersionEnv) }

// kubeBinary returns kube-apiserver, kube-controller-manager or
// kube-scheduler of the selected release (KubeVersionEnv): all three from the
// same release, as version skew allows no controller manager or scheduler
// newer than kube-apiserver.
func kubeBinary(name string) (string, error) {
	v := kubeVersion()
	if v == "" {
		return binary(name)
	}
	dir := filepath.Join(BinDir(), "k8s-"+v)
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s=%s: %s not found in %s: run make tools-oldest", KubeVersionEnv, v, name, dir)
	}
	return path, nil
}

// binary returns the path of a tool in BinDir, or an error saying how to build it.
func binary(name string) (string, error) {
	path := filepath.Join(BinDir(), name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s not found in %s: run make tools", name, BinDir())
	}
	return path, nil
}

// CRDDir holds the generated CustomResourceDefinitions.
func CRDDir() string { return filepath.Join(RepoRoot(), "manifests", "crd") }
