package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// RepoRoot is the root of the nodeguard repository, found from this file's path.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir is where make tools puts the control-plane binaries: $NODEGUARD_BIN_DIR,
// or bin/ in the repository.
func BinDir() string {
	if dir := os.Getenv("NODEGUARD_BIN_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(RepoRoot(), "bin")
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
