package harness

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// compiledModules lists the module versions of the packages that building
// pkgs compiles in dir (a replaced module at its replacement's version).
func compiledModules(t *testing.T, dir string, pkgs ...string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-deps", "-test", "-f", "{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} {{.Version}}{{end}}{{end}}"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", dir, err)
	}
	mods := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			mods[f[0]] = f[len(f)-1]
		}
	}
	return mods
}

// TestToolsShareNodeguardsDependencyVersions: every module whose packages
// both nodeguard and a tool compile is at one version in both, so that a cold
// make test compiles each of those packages once, not once per module.
func TestToolsShareNodeguardsDependencyVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the tools modules' packages")
	}
	root := RepoRoot()
	nodeguard := compiledModules(t, root, "./...")
	controlPlane := []string{"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler"}
	for dir, pkgs := range map[string][]string{
		"hack/tools/kube":      controlPlane,
		"hack/tools/kube-1.36": controlPlane,
		"hack/tools/codegen":   {"sigs.k8s.io/controller-tools/cmd/controller-gen"},
		"hack/tools/kwok":      {"sigs.k8s.io/kwok/cmd/kwok"},
		// make test's other modules: the chart's tests and the release's.
		"test/chart":   {"./..."},
		"hack/release": {"./..."},
	} {
		shared := 0
		for path, version := range compiledModules(t, filepath.Join(root, dir), pkgs...) {
			ours, ok := nodeguard[path]
			if !ok || path == "github.com/nodeguard/nodeguard" {
				continue
			}
			if dir == "hack/tools/kube-1.36" && keptAtTheOldestRelease(path) {
				continue
			}
			shared++
			if ours != version {
				t.Errorf("%s compiles %s %s, nodeguard %s: require nodeguard's version in %s/go.mod (or bump nodeguard's)", dir, path, version, ours, dir)
			}
		}
		if shared == 0 {
			t.Errorf("%s shares no module with nodeguard: the check compared nothing", dir)
		}
	}
}

// keptAtTheOldestRelease tells the modules that hack/tools/kube-1.36 keeps at
// the 1.36 release's versions (its go.mod says why): Kubernetes's own and the
// CEL engine, but not the libraries under k8s.io that every release shares.
func keptAtTheOldestRelease(path string) bool {
	switch path {
	case "github.com/google/cel-go", "github.com/antlr4-go/antlr/v4":
		return true
	case "k8s.io/utils", "k8s.io/kube-openapi", "k8s.io/klog/v2":
		return false
	}
	return strings.HasPrefix(path, "k8s.io/")
}
