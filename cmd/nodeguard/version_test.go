package main_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/test/harness"
)

// TestMakeBuildNamesTheBuild: a binary built by make build says which
// build it is: --version prints the version (git describe) and the full
// revision, and the same pair labels nodeguard_build_info on /metrics.
func TestMakeBuildNamesTheBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	bin := t.TempDir()
	if out, err := exec.Command("make", "-C", root, "build", "BIN="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "nodeguard"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("nodeguard --version: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	m := regexp.MustCompile(`^nodeguard (\S+) \S+/\S+ go\S+ commit ([0-9a-f]{40})$`).FindStringSubmatch(line)
	if m == nil || m[1] == "devel" || !strings.HasPrefix(m[1], "v") && !strings.HasPrefix(string(rev), strings.TrimSuffix(m[1], "-dirty")) {
		t.Fatalf("--version = %q, want a version (a tag, or git describe's commit) and the revision", line)
	}
	if m[2] != strings.TrimSpace(string(rev)) {
		t.Errorf("--version names revision %s, want HEAD %s", m[2], rev)
	}

	if env == nil {
		return // the metric needs a control plane (not with -short)
	}
	_ = env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeguard-system"}})
	r := &replica{metrics: freeAddr(t), probe: freeAddr(t)}
	n, err := harness.StartNodeguardProcess(filepath.Join(bin, "nodeguard"), filepath.Join(t.TempDir(), "nodeguard.log"),
		"--kubeconfig="+env.Kubeconfig, "--metrics-bind-address="+r.metrics, "--metrics-secure=false",
		"--health-probe-bind-address="+r.probe, "--leader-election-namespace=nodeguard-system", "--webhook-port=-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Kill)
	want := fmt.Sprintf(`nodeguard_build_info{goversion=%q,revision=%q,version=%q}`, runtime.Version(), m[2], m[1])
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return r.metric(want) == "1", nil
	}, "%s 1 on /metrics", want)
}
