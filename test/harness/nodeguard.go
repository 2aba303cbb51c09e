package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The one way tests, the sandbox and the bench build and run nodeguard.

// binaryDir holds the nodeguard binary built for this process; Run removes it.
var (
	binaryDir  string
	dirOnce    sync.Once
	dirErr     error
	buildOnce  sync.Once
	binaryPath string
	buildErr   error
	pluginOnce sync.Once
	pluginPath string
	pluginErr  error
)

// NodeguardBinary builds cmd/nodeguard once per process and returns its path.
func NodeguardBinary() (string, error) {
	buildOnce.Do(func() { binaryPath, buildErr = buildCommand("nodeguard") })
	return binaryPath, buildErr
}

// PluginBinary builds the kubectl plugin, cmd/kubectl-nodeguard, once per
// process and returns its path: with its directory on PATH, kubectl runs it
// as kubectl nodeguard.
func PluginBinary() (string, error) {
	pluginOnce.Do(func() { pluginPath, pluginErr = buildCommand("kubectl-nodeguard") })
	return pluginPath, pluginErr
}

// buildCommand builds cmd/NAME into the process's binary directory.
func buildCommand(name string) (string, error) {
	dirOnce.Do(func() { binaryDir, dirErr = os.MkdirTemp("", "nodeguard-bin-") })
	if dirErr != nil {
		return "", dirErr
	}
	path := filepath.Join(binaryDir, name)
	cmd := exec.Command("go", "build", "-o", path, "github.com/nodeguard/nodeguard/cmd/"+name)
	cmd.Dir = RepoRoot()
	// Static, as the image ships it; it also shares the build cache with
	// make's other builds when a test runs with cgo on (make test-race).
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	return path, nil
}

func removeNodeguardBinary() {
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
}

// Nodeguard is a running nodeguard process.
type Nodeguard struct {
	// LogPath holds its standard output and error.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartNodeguardProcess runs binary with args, appending its output to logPath.
// It dies with its parent, and runs in a process group of its own.
func StartNodeguardProcess(binary, logPath string, args ...string) (*Nodeguard, error) {
	return StartNodeguardProcessWithEnv(binary, logPath, nil, args...)
}

// StartNodeguardProcessWithEnv is StartNodeguardProcess with environment
// variables ("NAME=value") added to the test process's own, e.g. a replica's
// POD_NAME.
func StartNodeguardProcessWithEnv(binary, logPath string, env []string, args ...string) (*Nodeguard, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	n := &Nodeguard{LogPath: logPath, done: make(chan struct{})}
	n.cmd = exec.Command(binary, args...)
	if len(env) > 0 {
		n.cmd.Env = append(os.Environ(), env...)
	}
	n.cmd.Stdout, n.cmd.Stderr = logFile, logFile
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting nodeguard: %w", err)
	}
	go func() { n.err = n.cmd.Wait(); logFile.Close(); close(n.done) }()
	return n, nil
}

// StartNodeguard builds nodeguard (once) and runs it for the test with args. It
// is killed when the test ends; if the test failed, the tail of its log and
// the events nodeguard recorded (when c is not nil) are logged.
func StartNodeguard(t testing.TB, c client.Reader, args ...string) *Nodeguard {
	t.Helper()
	binary, err := NodeguardBinary()
	if err != nil {
		t.Fatal(err)
	}
	n, err := StartNodeguardProcess(binary, filepath.Join(t.TempDir(), "nodeguard.log"), args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Kill()
		if t.Failed() {
			t.Logf("nodeguard log (tail; whole log in %s):\n%s", keepLog(t.Name()+"-nodeguard", n.Log()), n.LogTail(15))
			if c != nil {
				t.Logf("nodeguard's events: %s", keepLog(t.Name()+"-events", nodeguardEvents(c)))
			}
		}
	})
	return n
}

// Kill stops nodeguard at once (SIGKILL: nothing of its own runs) and waits.
func (n *Nodeguard) Kill() {
	_ = n.cmd.Process.Kill()
	<-n.done
}

// Stop sends SIGTERM and waits for the exit, or kills after grace; it returns
// how the process ended.
func (n *Nodeguard) Stop(grace time.Duration) error {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
		return n.err
	case <-time.After(grace):
		n.Kill()
		return fmt.Errorf("nodeguard did not exit within %s of SIGTERM", grace)
	}
}

// Done is closed when the process has exited; Err then tells how.
func (n *Nodeguard) Done() <-chan struct{} { return n.done }

// Err is the process's exit error, once Done is closed.
func (n *Nodeguard) Err() error { return n.err }

// PID is the process ID.
func (n *Nodeguard) PID() int { return n.cmd.Process.Pid }

// Log returns everything nodeguard has written.
func (n *Nodeguard) Log() string {
	b, _ := os.ReadFile(n.LogPath)
	return string(b)
}

// LogTail returns the last lines of the log.
func (n *Nodeguard) LogTail(lines int) string { return tail(n.LogPath, lines) }

// WaitServing waits until addr accepts connections, failing early if nodeguard
// exits.
func (n *Nodeguard) WaitServing(addr string, timeout time.Duration) error {
	return Poll(context.Background(), timeout, func(context.Context) (bool, error) {
		select {
		case <-n.done:
			return false, errors.New("nodeguard exited; see " + n.LogPath)
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil, nil
	})
}

// WebhookArgs point nodeguard's webhook server at the port and certificate of
// the webhook configurations the control plane installed.
func (e *Env) WebhookArgs() []string {
	return []string{
		"--webhook-port=" + strconv.Itoa(e.Webhook.LocalServingPort),
		"--webhook-cert-dir=" + e.Webhook.LocalServingCertDir,
	}
}

// WebhookAddr is where the installed webhook configurations call.
func (e *Env) WebhookAddr() string {
	return net.JoinHostPort(e.Webhook.LocalServingHost, strconv.Itoa(e.Webhook.LocalServingPort))
}

// EmulatorArgs point nodeguard at an ARM emulator, with no azure.json and no
// credential.
func EmulatorArgs(armURL, subscription, resourceGroup string) []string {
	return []string{
		"--azure-config=", "--azure-arm-endpoint=" + armURL, "--azure-subscription-id=" + subscription,
		"--azure-resource-group=" + resourceGroup, "--azure-credential=none",
	}
}

// nodeguardEvents lists the events nodeguard recorded, a line each, for a
// failing test.
func nodeguardEvents(c client.Reader) string {
	var list eventsv1.EventList
	if err := c.List(context.Background(), &list); err != nil {
		return fmt.Sprintf("(listing events: %v)", err)
	}
	var b strings.Builder
	for _, e := range list.Items {
		if strings.HasPrefix(e.ReportingController, "nodeguard") {
			fmt.Fprintf(&b, "%s %s %s/%s: %s %s\n", e.EventTime.UTC().Format(time.RFC3339Nano), e.Type, e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note)
		}
	}
	return b.String()
}

// Kubectl runs kubectl with the kubeconfig and returns its combined output.
func Kubectl(kubeconfig, stdin string, args ...string) (string, error) {
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// MustKubectl runs kubectl and fails the test if it fails.
func MustKubectl(t testing.TB, kubeconfig, stdin string, args ...string) string {
	t.Helper()
	out, err := Kubectl(kubeconfig, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return out
}
