package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// stopGrace is how long a component gets to exit after SIGTERM before SIGKILL.
// kube-apiserver has been seen ignoring SIGTERM for more than 5 s.
const stopGrace = 5 * time.Second

// process is one control-plane component started by the harness. It dies with
// the test process (parent-death signal), runs in its own process group, and
// logs to a file whose tail is printed when a test fails.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func startProcess(name, logDir, path string, args ...string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating log for %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after stopGrace.
func (p *process) stop() {
	if done, _ := p.exited(); done {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// LogTail returns the last lines of a log file, for a failing test.
func LogTail(path string, lines int) string { return tail(path, lines) }

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// withParentDeathSignal writes a wrapper script that runs binary so that it is
// killed when its parent dies. envtest starts etcd and kube-apiserver itself
// (with its own process group but no parent-death signal), so the wrapper is
// how they too never outlive a test binary that was killed. setpriv keeps the
// PID, so envtest still signals the real process.
func withParentDeathSignal(dir, binary string) (string, error) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return binary, nil //nolint:nilerr // without setpriv, fall back to the plain binary
	}
	if _, err := os.Stat(binary); err != nil {
		return "", fmt.Errorf("%s is missing: run make tools: %w", binary, err)
	}
	wrapper := filepath.Join(dir, filepath.Base(binary))
	script := fmt.Sprintf("#!/bin/sh\nexec %s --pdeathsig KILL -- %s \"$@\"\n", setpriv, binary)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		return "", errors.Join(fmt.Errorf("writing wrapper for %s", binary), err)
	}
	return wrapper, nil
}
