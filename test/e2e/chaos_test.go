package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

// replica is one nodeguard of a highly available install: its own webhook
// and metrics ports and pod name, restarted after it is killed as a kubelet
// restarts a pod.
type replica struct {
	name        string
	binary      string
	args        []string
	webhookPort int
	metricsPort int
	logPath     string

	mu     sync.Mutex
	proc   *harness.Nodeguard
	starts int
}

// newReplica prepares a replica serving webhooks on its own port; common are
// the flags every replica shares.
func newReplica(t *testing.T, name, binary string, common []string) *replica {
	t.Helper()
	r := &replica{name: name, binary: binary, webhookPort: harness.FreePort(t), metricsPort: harness.FreePort(t),
		logPath: filepath.Join(t.TempDir(), name+".log")}
	r.args = append(slices.Clone(common),
		"--webhook-port="+strconv.Itoa(r.webhookPort), "--webhook-cert-dir="+env.Webhook.LocalServingCertDir,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", r.metricsPort), "--metrics-secure=false")
	t.Cleanup(func() {
		r.kill()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", r.name, harness.LogTail(r.logPath, 60))
		}
	})
	return r
}

func (r *replica) webhookAddr() string { return fmt.Sprintf("127.0.0.1:%d", r.webhookPort) }

// start runs the replica (again), appending to its log.
func (r *replica) start() error {
	p, err := harness.StartNodeguardProcessWithEnv(r.binary, r.logPath, []string{"POD_NAME=" + r.name}, r.args...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proc = p
	r.starts++
	return nil
}

// kill stops the replica with SIGKILL: nothing of its own runs, no Lease is
// released.
func (r *replica) kill() {
	r.mu.Lock()
	p := r.proc
	r.proc = nil
	r.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// running reports whether the replica's process was started and not stopped.
func (r *replica) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil
}

// stop sends SIGTERM, as a rolling update does, and waits for the exit.
func (r *replica) stop(grace time.Duration) error {
	r.mu.Lock()
	p := r.proc
	r.proc = nil
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(grace)
}

// leads reports whether the replica runs and says it holds the leader
// election Lease (nodeguard_leader_is_leader).
func (r *replica) leads(ctx context.Context) bool {
	if !r.running() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metricsPort), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if sc.Text() == "nodeguard_leader_is_leader 1" {
			return true
		}
	}
	return false
}

// killer SIGKILLs the leader of a set of replicas at random moments and
// restarts it a moment later, until stopped.
type killer struct {
	replicas []*replica
	every    [2]time.Duration

	mu       sync.Mutex
	kills    int
	failures []string
}

// leader waits for the one replica that leads.
func (k *killer) leader(ctx context.Context, timeout time.Duration) *replica {
	var found *replica
	_ = harness.Poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		for _, r := range k.replicas {
			if r.leads(ctx) {
				found = r
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// leaderGap bounds the time without a leader after a kill: the Lease
// duration, a retry period, start-up.
const leaderGap = time.Minute

func (k *killer) run(ctx context.Context) {
	for sleep(ctx, randomIn(k.every)) {
		r := k.leader(ctx, leaderGap)
		if ctx.Err() != nil {
			return
		}
		if r == nil {
			k.fail("no replica led for %s", leaderGap)
			continue
		}
		r.kill()
		k.mu.Lock()
		k.kills++
		k.mu.Unlock()
		// A restarted pod comes back within seconds.
		if !sleep(ctx, randomIn([2]time.Duration{500 * time.Millisecond, 3 * time.Second})) {
			return
		}
		if err := r.start(); err != nil {
			k.fail("restarting %s: %v", r.name, err)
		}
	}
}

func (k *killer) fail(format string, args ...any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failures = append(k.failures, fmt.Sprintf(format, args...))
}

func (k *killer) counts() (kills int, failures []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.kills, slices.Clone(k.failures)
}

// faultClass is one kind of ARM failure the soak injects.
type faultClass string

const (
	faultThrottled    faultClass = "429 with Retry-After"
	faultPrecondition faultClass = "412 on a pool write"
	faultServerError  faultClass = "500 past the SDK's retries"
	faultHang         faultClass = "hang past the request timeout"
	faultRefused      faultClass = "connection refused"
)

var faultClasses = []faultClass{faultThrottled, faultPrecondition, faultServerError, faultHang, faultRefused}

// armPaths matches every ARM call nodeguard makes.
const armPaths = "/providers/Microsoft.Network/"

// faultInjector injects ARM faults at random moments, each class in turn (in
// a shuffled order each cycle), each waiting until nodeguard has run into it.
type faultInjector struct {
	emu   *armemulator.Server
	front *armemulator.Front
	every [2]time.Duration
	// refused counts the ARM calls nodeguard found refused so far.
	refused func() int

	mu       sync.Mutex
	injected map[faultClass]int
	hit      map[faultClass]int
}

func newFaultInjector(emu *armemulator.Server, front *armemulator.Front, every [2]time.Duration, refused func() int) *faultInjector {
	return &faultInjector{emu: emu, front: front, every: every, refused: refused, injected: map[faultClass]int{}, hit: map[faultClass]int{}}
}

func (f *faultInjector) run(ctx context.Context) {
	var order []faultClass
	for sleep(ctx, randomIn(f.every)) {
		if len(order) == 0 {
			order = slices.Clone(faultClasses)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		class := order[0]
		order = order[1:]
		f.count(f.injected, class)
		if class == faultRefused {
			f.refuse(ctx)
			continue
		}
		f.arm(ctx, class)
	}
}

// refuse takes the ARM endpoint away: new calls are refused and calls in
// flight break. It comes back a few seconds after nodeguard ran into it (at
// most after a minute).
func (f *faultInjector) refuse(ctx context.Context) {
	before := f.refused()
	_ = f.front.Down()
	defer func() { _ = f.front.Up() }()
	_ = harness.Poll(ctx, time.Minute, func(context.Context) (bool, error) { return f.refused() > before, nil })
	sleep(ctx, randomIn([2]time.Duration{time.Second, 4 * time.Second}))
}

// arm injects one fault of the class and waits until it has been served (or
// a minute passed without an ARM call matching it).
func (f *faultInjector) arm(ctx context.Context, class faultClass) {
	hits := make(chan struct{}, 8)
	fault := armemulator.Fault{Path: armPaths, Times: 1, Before: func() {
		f.count(f.hit, class)
		hits <- struct{}{}
	}}
	switch class {
	case faultThrottled:
		fault.Status, fault.RetryAfter = http.StatusTooManyRequests, "2"
	case faultPrecondition:
		fault.Method, fault.Path, fault.Status = http.MethodPut, "/backendAddressPools/", http.StatusPreconditionFailed
	case faultServerError:
		// One more than the SDK's own retries: the call fails.
		fault.Status, fault.Times = http.StatusInternalServerError, 4
	case faultHang:
		fault.Hang = true
	}
	remove := f.emu.AddFault(fault)
	defer remove()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for range fault.Times {
		select {
		case <-ctx.Done():
			return
		case <-timeout.C:
			return
		case <-hits:
		}
	}
}

func (f *faultInjector) count(m map[faultClass]int, class faultClass) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m[class]++
}

// counts returns how often each class was injected and how many ARM calls
// it hit. A refused connection never reaches the emulator: those are the
// calls nodeguard logged as refused.
func (f *faultInjector) counts() (injected, hit map[faultClass]int) {
	refused := f.refused()
	f.mu.Lock()
	defer f.mu.Unlock()
	hit = map[faultClass]int{faultRefused: refused}
	for c, n := range f.hit {
		hit[c] = n
	}
	return maps.Clone(f.injected), hit
}

// randomIn is a random duration in [r[0], r[1]).
func randomIn(r [2]time.Duration) time.Duration {
	return r[0] + rand.N(r[1]-r[0])
}

// sleep waits d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// countInLogs counts the lines of the replicas' logs containing every part.
func countInLogs(replicas []*replica, parts ...string) int {
	n := 0
	for _, r := range replicas {
		log, _ := os.ReadFile(r.logPath)
		for _, line := range strings.Split(string(log), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				n++
			}
		}
	}
	return n
}
