package harness_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		runOrphanHelper()
		return
	}
	harness.Main(m, harness.Options{Cluster: true}, &env)
}

// TestClusterSchedulesOntoKwokAndComputesPDBs is the harness smoke test: a
// Deployment is scheduled onto kwok nodes, its pods become Ready, and the
// disruption controller computes the PDB's allowed disruptions.
func TestClusterSchedulesOntoKwokAndComputesPDBs(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	ctx := context.Background()
	c := env.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	objs := []client.Object{ns}
	for i := range 3 {
		objs = append(objs, builder.Node(fmt.Sprintf("smoke-%d", i), builder.WithLabels("pool", "smoke"), builder.WithInternalIP(fmt.Sprintf("10.1.0.%d", i+4))))
	}
	objs = append(objs,
		builder.Deployment("smoke", "web", 4, builder.OnNodes("pool", "smoke")),
		builder.PDB("smoke", "web", builder.MaxUnavailable("1")))
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s: %v", obj.GetName(), err)
		}
	}

	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace("smoke")); err != nil {
			return false, err
		}
		ready := 0
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Spec.NodeName, "smoke-") && harness.PodReady(&p) {
				ready++
			}
		}
		return ready == 4, nil
	}, "4 pods are Ready on kwok nodes")

	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var pdb policyv1.PodDisruptionBudget
		if err := c.Get(ctx, client.ObjectKey{Namespace: "smoke", Name: "web"}, &pdb); err != nil {
			return false, err
		}
		return pdb.Status.CurrentHealthy == 4 && pdb.Status.DisruptionsAllowed == 1, nil
	}, "the PDB reports 4 healthy pods and 1 allowed disruption")

	var node corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: "smoke-0"}, &node); err != nil {
		t.Fatal(err)
	}
	if got := internalIP(&node); got != "10.1.0.4" {
		t.Errorf("node InternalIP = %q, want the builder's 10.1.0.4 kept by kwok", got)
	}
	out, err := exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "get", "nodes", "-o", "name").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "node/smoke-0") {
		t.Errorf("kubectl with the harness kubeconfig: %v\n%s", err, out)
	}
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

const helperEnv = "NODEGUARD_HARNESS_ORPHAN_HELPER"

// runOrphanHelper starts a control plane, prints its directory, and waits to be killed.
func runOrphanHelper() {
	e, err := harness.Start(context.Background(), harness.Options{Dir: os.Getenv(helperEnv)})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("started", e.Dir)
	select {}
}

// TestNoComponentOutlivesAKilledTestProcess kills (SIGKILL, so no cleanup runs)
// a process that started a control plane, and checks that etcd and
// kube-apiserver die with it instead of living on as orphans, and that their
// state (etcd's data, 123 MB) is in the env's directory, removed with it.
func TestNoComponentOutlivesAKilledTestProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if !strings.HasPrefix(line, "started") {
		_ = cmd.Process.Kill()
		t.Fatalf("helper did not start a control plane: %s", line)
	}
	children := childrenOf(cmd.Process.Pid)
	if len(children) < 2 {
		t.Fatalf("want etcd and kube-apiserver as children of the helper, found pids %v", children)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		for _, pid := range children {
			if alive(pid) {
				return false, fmt.Errorf("pid %d is still running", pid)
			}
		}
		return true, nil
	}, "every component of the killed process has exited")
	// No Stop ran: what the components kept must be in the env's directory,
	// which the test's cleanup removes, not left elsewhere in $TMPDIR.
	for _, kept := range []string{filepath.Join(dir, "etcd", "member"), filepath.Join(dir, "apiserver", "apiserver.crt")} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("the killed control plane's state is not in its env's directory: %v", err)
		}
	}
	_ = os.RemoveAll(filepath.Join(dir))
}

// childrenOf lists the PIDs whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces) start after ")".
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
