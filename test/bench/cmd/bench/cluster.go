package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

const (
	subscription  = "00000000-0000-0000-0000-000000000000"
	resourceGroup = "mc_bench"
	// managedLabel marks the nodes nodeguard manages in a run (--node-selector):
	// the node kubectl drains is left alone.
	managedLabel = "bench.nodeguard.io/managed"
)

// startCluster starts a full local cluster (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok) with nodeguard's webhook
// configurations installed, logging to dir. A fleet cluster (thousands of
// nodes) gets kwok's larger worker counts and heartbeats that may lag
// (scaleKwokParallelism, fleetNodeMonitorGracePeriod); auditPolicy, when set,
// is kube-apiserver's audit policy.
func startCluster(ctx context.Context, dir, podStages string, fleet bool, auditPolicy string) (*harness.Env, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	var kwokParallelism int
	var gracePeriod time.Duration
	if fleet {
		kwokParallelism, gracePeriod = scaleKwokParallelism, fleetNodeMonitorGracePeriod
	}
	env, err := harness.Start(ctx, harness.Options{
		Cluster: true, PodStages: podStages, Dir: dir,
		KwokParallelism: kwokParallelism, NodeMonitorGracePeriod: gracePeriod,
		WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
		// Budgets are created while the no-op webhook or no nodeguard serves.
		WithoutWebhooks: []string{ngwebhook.BudgetWebhookName},
		AuditPolicy:     auditPolicy,
	})
	if err != nil {
		if env != nil {
			fmt.Fprint(os.Stderr, env.LogTails(20))
			_ = env.Stop()
		}
		return nil, err
	}
	return env, nil
}

// extraNodeguardFlags are --nodeguard-flags, added to every nodeguard started.
var extraNodeguardFlags []string

// nodeguardProc is nodeguard running as a subprocess.
type nodeguardProc struct{ *harness.Nodeguard }

// startNodeguard runs the binary against the cluster (through kubeconfig, e.g.
// a recording proxy) and, when armURL is set, the ARM emulator, and waits until
// its webhook server accepts connections.
func startNodeguard(binary string, env *harness.Env, kubeconfig, armURL, logPath string, extra ...string) (*nodeguardProc, error) {
	args := append([]string{
		"--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--leader-elect=false",
		"--node-selector=" + managedLabel + "=true",
		"--azure-config=",
		// The bench measures replacement first (the manifests' default is wait).
		"--blocked-pdb-policy=replace",
	}, env.WebhookArgs()...)
	if armURL != "" {
		args = append(args, harness.EmulatorArgs(armURL, subscription, resourceGroup)...)
	}
	args = append(append(args, extra...), extraNodeguardFlags...)
	ng, err := harness.StartNodeguardProcess(binary, logPath, args...)
	if err != nil {
		return nil, err
	}
	p := &nodeguardProc{ng}
	if err := ng.WaitServing(env.WebhookAddr(), 30*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *nodeguardProc) pid() int { return p.PID() }

// stop sends SIGTERM and waits (SIGKILL after 10 s).
func (p *nodeguardProc) stop() { _ = p.Stop(10 * time.Second) }

// startAPIProxy starts a recording proxy whose kubeconfig is dir/name.kubeconfig.
func startAPIProxy(env *harness.Env, dir, name string) (*harness.APIProxy, error) {
	return harness.StartAPIProxy(env.Config, filepath.Join(dir, name+".kubeconfig"))
}

// firstEviction is when the first eviction request of namespace ns was sent.
func firstEviction(p *harness.APIProxy, ns string) time.Time {
	var first time.Time
	for _, e := range p.Evictions(ns) {
		if first.IsZero() || e.Start.Before(first) {
			first = e.Start
		}
	}
	return first
}

// evictionsAnswered counts the eviction requests of namespace ns answered with
// status (0: any).
func evictionsAnswered(p *harness.APIProxy, ns string, status int) int {
	n := 0
	for _, e := range p.Evictions(ns) {
		if status == 0 || e.Status == status {
			n++
		}
	}
	return n
}

// maxInFlight is the most eviction requests in flight at once for one of the
// apps of namespace ns.
func maxInFlight(p *harness.APIProxy, ns string, apps []string) int {
	m := 0
	for _, a := range apps {
		m = max(m, p.MaxInFlight(ns, a))
	}
	return m
}

// procSample is a process's resident memory and CPU time used so far.
type procSample struct {
	At  time.Time
	RSS int64         // bytes
	CPU time.Duration // user + system
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports here.
const clockTicks = 100

// readProc reads /proc/<pid>/status (VmRSS) and /proc/<pid>/stat (utime, stime).
func readProc(pid int) (procSample, error) {
	s := procSample{At: time.Now()}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			s.RSS = kb * 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	rest := string(stat)[strings.LastIndexByte(string(stat), ')')+2:]
	f := strings.Fields(rest)
	if len(f) < 13 {
		return s, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	s.CPU = time.Duration(utime+stime) * time.Second / clockTicks
	return s, nil
}

// childPID finds a direct child process of this one by the base name of its
// executable (the harness starts kube-controller-manager and friends as
// children; /proc/<pid>/comm is cut at 15 characters, so read cmdline).
func childPID(name string) int {
	entries, _ := os.ReadDir("/proc")
	me := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		if filepath.Base(argv0) != name {
			continue
		}
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "PPid:" && f[1] == me {
				return pid
			}
		}
	}
	return 0
}
