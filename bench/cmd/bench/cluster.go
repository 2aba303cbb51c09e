package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/test/harness"
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
// configurations installed, logging to dir.
func startCluster(ctx context.Context, dir, podStages string) (*harness.Env, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	env, err := harness.Start(ctx, harness.Options{
		Cluster: true, PodStages: podStages, Dir: dir,
		WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
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

// nodeguardProc is nodeguard running as a subprocess.
type nodeguardProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startNodeguard runs the binary against the cluster (through kubeconfig, e.g.
// a recording proxy) and, when armURL is set, the ARM emulator.
func startNodeguard(binary string, env *harness.Env, kubeconfig, armURL, logPath string, extra ...string) (*nodeguardProc, error) {
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		fmt.Sprintf("--webhook-port=%d", env.Webhook.LocalServingPort),
		"--webhook-cert-dir=" + env.Webhook.LocalServingCertDir,
		"--leader-elect=false",
		"--node-selector=" + managedLabel + "=true",
		"--azure-config=",
	}
	if armURL != "" {
		args = append(args, "--azure-arm-endpoint="+armURL, "--azure-subscription-id="+subscription,
			"--azure-resource-group="+resourceGroup, "--azure-credential=none")
	}
	args = append(args, extra...)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting nodeguard: %w", err)
	}
	p := &nodeguardProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.done) }()
	// Wait until the webhook server answers TLS on its port.
	addr := net.JoinHostPort(env.Webhook.LocalServingHost, strconv.Itoa(env.Webhook.LocalServingPort))
	err = harness.Poll(context.Background(), 30*time.Second, func(context.Context) (bool, error) {
		select {
		case <-p.done:
			return false, fmt.Errorf("nodeguard exited; see %s", logPath)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *nodeguardProc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits (SIGKILL after 10 s).
func (p *nodeguardProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// evictionPath matches POST .../namespaces/<ns>/pods/<name>/eviction.
var evictionPath = regexp.MustCompile(`/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$`)

// apiProxy sits between a client (nodeguard, kubectl) and kube-apiserver and
// records eviction requests per PDB-protected workload ("ns/app", from the
// Deployment pod name): answers, and the most ever in flight at once.
type apiProxy struct {
	kubeconfig string
	srv        *http.Server

	mu       sync.Mutex
	inFlight map[string]int
	maxInFl  map[string]int
	answers  map[string]map[int]int // workload -> status -> count
	first    map[string]time.Time   // namespace -> first eviction request
	log      []evictionRecord
}

// evictionRecord is one eviction request through the proxy.
type evictionRecord struct {
	Workload string    `json:"workload"`
	Pod      string    `json:"pod"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Status   int       `json:"status"`
}

func startAPIProxy(env *harness.Env, dir, name string) (*apiProxy, error) {
	target, err := url.Parse(env.Config.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(env.Config)
	if err != nil {
		return nil, err
	}
	p := &apiProxy{inFlight: map[string]int{}, maxInFl: map[string]int{}, answers: map[string]map[int]int{}, first: map[string]time.Time{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	rp.FlushInterval = -1 // stream watches
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := evictionPath.FindStringSubmatch(r.URL.Path)
		if r.Method != http.MethodPost || m == nil {
			rp.ServeHTTP(w, r)
			return
		}
		workload := m[1] + "/" + workloadOf(m[2])
		began := time.Now()
		p.begin(workload)
		// The request ends, for the in-flight count, when the apiserver's
		// answer starts back to the client: the client may send its next
		// request before this handler returns.
		var ended time.Time
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK, onHeader: func(status int) {
			ended = time.Now()
			p.end(workload, status)
		}}
		rp.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		if ended.IsZero() {
			ended = time.Now()
			p.end(workload, rec.status)
		}
		p.mu.Lock()
		p.log = append(p.log, evictionRecord{Workload: workload, Pod: m[2], Start: began, End: ended, Status: rec.status})
		p.mu.Unlock()
	})}
	go func() { _ = p.srv.Serve(l) }()
	p.kubeconfig = filepath.Join(dir, name+".kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: http://" + l.Addr().String() +
		"\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\nusers:\n- name: proxy\n  user: {}\n"
	return p, os.WriteFile(p.kubeconfig, []byte(kc), 0o600)
}

func (p *apiProxy) close() { _ = p.srv.Close() }

// workloadOf turns a Deployment pod name (app-<hash>-<id>) into "app".
func workloadOf(pod string) string {
	parts := strings.Split(pod, "-")
	if len(parts) < 3 {
		return pod
	}
	return strings.Join(parts[:len(parts)-2], "-")
}

func (p *apiProxy) begin(workload string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight[workload]++
	ns := workload[:strings.IndexByte(workload, '/')]
	if _, ok := p.first[ns]; !ok {
		p.first[ns] = time.Now()
	}
	p.maxInFl[workload] = max(p.maxInFl[workload], p.inFlight[workload])
}

func (p *apiProxy) end(workload string, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight[workload]--
	if p.answers[workload] == nil {
		p.answers[workload] = map[int]int{}
	}
	p.answers[workload][status]++
}

// evictions sums the answers with the given status over the workloads of
// namespace ns (status 0: every answer).
func (p *apiProxy) evictions(ns string, status int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for w, byStatus := range p.answers {
		if !strings.HasPrefix(w, ns+"/") {
			continue
		}
		for s, c := range byStatus {
			if status == 0 || s == status {
				n += c
			}
		}
	}
	return n
}

// firstEviction is when the first eviction request of namespace ns arrived.
func (p *apiProxy) firstEviction(ns string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first[ns]
}

// evictionLog returns every eviction request of namespace ns.
func (p *apiProxy) evictionLog(ns string) []evictionRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []evictionRecord
	for _, e := range p.log {
		if strings.HasPrefix(e.Workload, ns+"/") {
			out = append(out, e)
		}
	}
	return out
}

// maxInFlight is the most eviction requests in flight at once for one
// workload of namespace ns, over the given apps.
func (p *apiProxy) maxInFlight(ns string, apps []string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := 0
	for _, a := range apps {
		m = max(m, p.maxInFl[ns+"/"+a])
	}
	return m
}

type statusRecorder struct {
	http.ResponseWriter
	status   int
	onHeader func(status int)
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	if r.onHeader != nil {
		r.onHeader(code)
		r.onHeader = nil
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
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
