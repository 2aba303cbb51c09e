package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubeBinaryOfTheOldestRelease: with NODEGUARD_KUBE_VERSION set, all three
// components come from bin/k8s-<version>, and a missing one names the make
// target that builds it rather than falling back to the newest release.
func TestKubeBinaryOfTheOldestRelease(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("NODEGUARD_BIN_DIR", dir)
	t.Setenv(KubeVersionEnv, OldestKubeVersion)
	oldest := filepath.Join(dir, "k8s-"+OldestKubeVersion)
	if err := os.MkdirAll(oldest, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		// The newest release's binary is there, the oldest's not yet.
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := kubeBinary(name); err == nil || !strings.Contains(err.Error(), "make tools-oldest") || !strings.Contains(err.Error(), name) {
			t.Errorf("%s missing from %s: error %v, want one naming it and make tools-oldest", name, oldest, err)
		}
		if err := os.WriteFile(filepath.Join(oldest, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if path, err := kubeBinary(name); err != nil || path != filepath.Join(oldest, name) {
			t.Errorf("kubeBinary(%s) = %s, %v; want %s", name, path, err, filepath.Join(oldest, name))
		}
	}
}

// TestRepoRootIsTheModule: RepoRoot finds the nodeguard module's root in
// either build, with source paths (go test) or without (make's -trimpath).
func TestRepoRootIsTheModule(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join(RepoRoot(), "go.mod"))
	if err != nil || !strings.HasPrefix(string(mod), moduleLine) {
		t.Fatalf("RepoRoot %s: go.mod %v, want the nodeguard module's", RepoRoot(), err)
	}
}
