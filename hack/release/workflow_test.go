// Package release holds the checks of what a release publishes; the image
// itself is built and checked in ./image.
package release

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
)

var workflows = filepath.Join("..", "..", ".github", "workflows")

// TestWorkflowsLint runs actionlint on every workflow: syntax, expressions
// and their types, known actions' inputs, job permissions, and the shell
// scripts when shellcheck is installed. The workflows cannot run here.
func TestWorkflowsLint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(workflows, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflows in %s: %v", workflows, err)
	}
	opts := &actionlint.LinterOptions{}
	if path, err := exec.LookPath("shellcheck"); err == nil {
		opts.Shellcheck = path
	} else {
		t.Log("shellcheck is not installed: run: scripts are not checked")
	}
	linter, err := actionlint.NewLinter(io.Discard, opts)
	if err != nil {
		t.Fatal(err)
	}
	errs, err := linter.LintFiles(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("%s:%d:%d: %s [%s]", e.Filepath, e.Line, e.Column, e.Message, e.Kind)
	}
}

// TestReleaseWorkflowPublishes: on a version tag the release workflow checks
// the image on both platforms (make test-release), builds it with make image,
// pushes it, attaches
// an SBOM, pushes the chart as an OCI artifact, and attaches the kubectl
// plugin's archives to the GitHub release.
func TestReleaseWorkflowPublishes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(workflows, "release.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := string(data)
	for _, want := range []string{
		`tags: ["v*.*.*"]`,
		"make test-release",
		"make image VERSION=",
		`PUSH="${{ steps.names.outputs.image }}:`,
		"anchore/sbom-action@",
		"actions/attest-sbom@",
		"push-to-registry: true",
		"helm lint --strict charts/nodeguard",
		"helm push ",
		"oci://ghcr.io/",
		"make plugin-archives VERSION=",
		"_output/plugin/*.tar.gz _output/plugin/sha256sums.txt",
	} {
		if !strings.Contains(w, want) {
			t.Errorf("release.yaml lacks %q", want)
		}
	}
}
