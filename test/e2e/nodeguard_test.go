package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	eventsv1 "k8s.io/api/events/v1"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

const (
	subscription  = "00000000-0000-0000-0000-000000000000"
	resourceGroup = "mc_e2e"
)

// process is a running nodeguard.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startNodeguard runs the binary against the API server (through kubeconfig)
// and the ARM emulator, serving the installed webhooks.
func startNodeguard(t *testing.T, kubeconfig string, emu *armemulator.Server, extra ...string) *process {
	t.Helper()
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-port=%d", env.Webhook.LocalServingPort),
		"--webhook-cert-dir=" + env.Webhook.LocalServingCertDir,
		"--leader-elect=false",
		"--azure-config=", "--azure-arm-endpoint=" + emu.URL(), "--azure-subscription-id=" + subscription,
		"--azure-resource-group=" + resourceGroup, "--azure-credential=none",
	}, extra...)
	logPath := filepath.Join(t.TempDir(), "nodeguard.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nodeguard, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("nodeguard log (%d bytes, tail):\n%s", len(b), tailString(string(b), 40))
			dumpEvents(t)
		}
	})
	return p
}

// kill stops nodeguard at once (SIGKILL: no cleanup runs).
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func tailString(s string, lines int) string {
	n := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			n++
			if n > lines {
				return s[i+1:]
			}
		}
	}
	return s
}

// dumpEvents logs the events of the run, for a failing test.
func dumpEvents(t *testing.T) {
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list); err != nil {
		return
	}
	for _, e := range list.Items {
		if e.ReportingController != "" && strings.HasPrefix(e.ReportingController, "nodeguard") {
			t.Logf("event %s %s/%s: %s %s", e.Type, e.Regarding.Kind, e.Regarding.Name, e.Reason, e.Note)
		}
	}
}
