package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// outOfService is the signal taint the cutover section toggles.
var outOfService = corev1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}

// cutoverResult is the admin-state cut-over section.
type cutoverResult struct {
	ARMLatency time.Duration   `json:"armLatency"`
	FirstPUT   bench.Summary   `json:"taintToFirstDownPUT"`
	AllPUTs    bench.Summary   `json:"taintToLastDownPUT"`
	Busy       bench.Summary   `json:"taintToFirstDownPUTWhileAWriteIsInFlight"`
	PoolsNode  int             `json:"poolsPerNode"`
	Fleet      []fleetRound    `json:"fleet"`
	Raw        []time.Duration `json:"rawTaintToFirstDownPUT"`
}

type fleetRound struct {
	Nodes       int           `json:"nodes"`
	Pools       int           `json:"pools"`
	PUTs        int           `json:"puts"`
	GETs        int           `json:"gets"`
	Naive       int           `json:"naivePUTs"`
	AllDown     time.Duration `json:"firstTaintToAllDown"`
	AfterAccept time.Duration `json:"lastTaintAcceptedToAllDown"`
	TaintSpread time.Duration `json:"tainting"`
}

// putEvent is a backend pool PUT as the emulator received it.
type putEvent struct {
	at     time.Time
	pool   string
	states map[string]string // entry name -> admin state ("" for none)
}

// putRecorder is an http.Handler in front of the emulator that records each
// pool PUT on arrival, before the emulator's added latency.
type putRecorder struct {
	emu *armemulator.Server
	mu  sync.Mutex
	put []putEvent
	get int
	ch  chan struct{}
}

func (p *putRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(strings.ToLower(r.URL.Path), "/backendaddresspools/") {
		at := time.Now()
		switch r.Method {
		case http.MethodPut:
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var pool armnetwork.BackendAddressPool
			_ = json.Unmarshal(body, &pool)
			ev := putEvent{at: at, pool: r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:], states: map[string]string{}}
			if pool.Properties != nil {
				for _, e := range pool.Properties.LoadBalancerBackendAddresses {
					if e != nil && e.Name != nil && e.Properties != nil {
						s := ""
						if e.Properties.AdminState != nil {
							s = string(*e.Properties.AdminState)
						}
						ev.states[*e.Name] = s
					}
				}
			}
			p.mu.Lock()
			p.put = append(p.put, ev)
			p.mu.Unlock()
			select {
			case p.ch <- struct{}{}:
			default:
			}
		case http.MethodGet:
			p.mu.Lock()
			p.get++
			p.mu.Unlock()
		}
	}
	p.emu.ServeHTTP(w, r)
}

// since returns the PUTs that arrived at or after t.
func (p *putRecorder) since(t time.Time) []putEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []putEvent
	for _, e := range p.put {
		if !e.at.Before(t) {
			out = append(out, e)
		}
	}
	return out
}

func (p *putRecorder) counts() (puts, gets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.put), p.get
}

// waitPUTs waits until, among the PUTs since t, every pool in pools has
// received one setting node to state; it returns the arrival of the first
// and of the last of those.
func (p *putRecorder) waitPUTs(ctx context.Context, t time.Time, node, state string, pools int) (first, last time.Time, err error) {
	deadline := time.After(30 * time.Second)
	for {
		seen := map[string]bool{}
		first, last = time.Time{}, time.Time{}
		for _, e := range p.since(t) {
			if s, ok := e.states[node]; ok && (s == state || state == "None" && s == "") && !seen[e.pool] {
				seen[e.pool] = true
				if first.IsZero() {
					first = e.at
				}
				last = e.at
			}
		}
		if len(seen) >= pools {
			return first, last, nil
		}
		select {
		case <-p.ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return first, last, fmt.Errorf("node %s: %d of %d pools got a PUT setting %s", node, len(seen), pools, state)
		case <-ctx.Done():
			return first, last, ctx.Err()
		}
	}
}

// runCutover measures the taint watcher and admin-state manager against the
// ARM emulator with a fixed latency on every call.
func runCutover(ctx context.Context, c config, env *harness.Env) (*cutoverResult, error) {
	cl := env.Client
	const probe = "cut-probe"
	// Pools: two node groups, each in a pool of the public and of the
	// internal load balancer: every node is in 2 of the 4 pools.
	groups := [2][]armemulator.EntrySeed{}
	var names []string
	for i := range c.fleetNodes + 1 {
		name := fmt.Sprintf("fleet-%03d", i-1)
		if i == 0 {
			name = probe
		}
		ip := fmt.Sprintf("10.30.%d.%d", i/200, i%200+10)
		if err := create(ctx, cl, builder.Node(name, builder.WithLabels(managedLabel, "true"), builder.WithInternalIP(ip))); err != nil {
			return nil, err
		}
		groups[i%2] = append(groups[i%2], armemulator.EntrySeed{Name: name, IP: ip})
		if i > 0 {
			names = append(names, name)
		}
	}
	seed := armemulator.Seed{Subscription: subscription, ResourceGroup: resourceGroup, LoadBalancers: []armemulator.LoadBalancerSeed{
		{Name: "kubernetes", Pools: []armemulator.PoolSeed{{Name: "pool-a", Entries: groups[0]}, {Name: "pool-b", Entries: groups[1]}}},
		{Name: "kubernetes-internal", Pools: []armemulator.PoolSeed{{Name: "pool-c", Entries: groups[0]}, {Name: "pool-d", Entries: groups[1]}}},
	}}
	emu := armemulator.New(seed, armemulator.Options{})
	emu.AddFault(armemulator.Fault{Delay: c.armLatency})
	rec := &putRecorder{emu: emu, ch: make(chan struct{}, 1)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: rec}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	ng, err := startNodeguard(c.nodeguard, env, env.Kubeconfig, "http://"+l.Addr().String(), filepath.Join(env.Dir, "nodeguard-cutover.log"))
	if err != nil {
		return nil, err
	}
	defer ng.stop()

	r := &cutoverResult{ARMLatency: c.armLatency, PoolsNode: 2}
	// trial taints the probe node and waits for its Down PUTs, then untaints it
	// and waits for the None PUTs to arrive and, unless busy, to complete: a
	// busy trial's taint lands while the previous write is still in flight.
	trial := func(busy bool) (first, last time.Duration, err error) {
		sent := time.Now()
		if err := setTaint(ctx, cl, probe, true); err != nil {
			return 0, 0, err
		}
		accepted := time.Now()
		f, l, err := rec.waitPUTs(ctx, sent, probe, "Down", 2)
		if err != nil {
			return 0, 0, err
		}
		sent = time.Now()
		if err := setTaint(ctx, cl, probe, false); err != nil {
			return 0, 0, err
		}
		if _, _, err := rec.waitPUTs(ctx, sent, probe, "None", 2); err != nil {
			return 0, 0, err
		}
		if !busy {
			err = harness.Poll(ctx, 30*time.Second, func(context.Context) (bool, error) {
				for key, s := range emu.AdminStates() {
					if strings.HasSuffix(key, "/"+probe) && s != "None" {
						return false, nil
					}
				}
				return true, nil
			})
			time.Sleep(20 * time.Millisecond)
		}
		return max(f.Sub(accepted), 0), max(l.Sub(accepted), 0), err
	}
	var firsts, lasts, busy []time.Duration
	logf("cutover: %d taint/untaint trials on one node, ARM latency %s", c.cutTrials, c.armLatency)
	if _, _, err := trial(false); err != nil { // warm-up: pool discovery
		return nil, err
	}
	for range c.cutTrials {
		f, l, err := trial(false)
		if err != nil {
			return nil, err
		}
		firsts, lasts = append(firsts, f), append(lasts, l)
	}
	for range c.cutTrials / 2 {
		f, _, err := trial(true)
		if err != nil {
			return nil, err
		}
		busy = append(busy, f)
	}
	r.FirstPUT, r.AllPUTs, r.Busy, r.Raw = bench.Summarize(firsts), bench.Summarize(lasts), bench.Summarize(busy), firsts

	logf("cutover: %d nodes tainted at once, %d rounds", c.fleetNodes, c.fleetRounds)
	for range c.fleetRounds {
		fr, err := fleetRoundRun(ctx, cl, emu, rec, names)
		if err != nil {
			return r, err
		}
		r.Fleet = append(r.Fleet, fr)
	}
	return r, nil
}

func fleetRoundRun(ctx context.Context, cl client.Client, emu *armemulator.Server, rec *putRecorder, names []string) (fleetRound, error) {
	fr := fleetRound{Nodes: len(names), Pools: 4, Naive: 2 * len(names)}
	puts0, gets0 := rec.counts()
	start := time.Now()
	if err := forEach(ctx, names, 20, func(ctx context.Context, n string) error { return setTaint(ctx, cl, n, true) }); err != nil {
		return fr, err
	}
	accepted := time.Now()
	fr.TaintSpread = accepted.Sub(start)
	allIn := func(state string) bool {
		want := map[string]bool{}
		for _, n := range names {
			want[n] = true
		}
		for key, s := range emu.AdminStates() {
			if want[key[strings.LastIndex(key, "/")+1:]] && s != state {
				return false
			}
		}
		return true
	}
	if err := harness.Poll(ctx, 2*time.Minute, func(context.Context) (bool, error) { return allIn("Down"), nil }); err != nil {
		return fr, fmt.Errorf("waiting for %d nodes to be Down in every pool: %w", len(names), err)
	}
	done := time.Now()
	fr.AllDown, fr.AfterAccept = done.Sub(start), done.Sub(accepted)
	puts, gets := rec.counts()
	fr.PUTs, fr.GETs = puts-puts0, gets-gets0
	if err := forEach(ctx, names, 20, func(ctx context.Context, n string) error { return setTaint(ctx, cl, n, false) }); err != nil {
		return fr, err
	}
	err := harness.Poll(ctx, 2*time.Minute, func(context.Context) (bool, error) { return allIn("None"), nil })
	return fr, err
}

// setTaint adds or removes the out-of-service taint.
func setTaint(ctx context.Context, cl client.Client, name string, on bool) error {
	var node corev1.Node
	if err := cl.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		return err
	}
	patch := client.MergeFrom(node.DeepCopy())
	var taints []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != outOfService.Key {
			taints = append(taints, t)
		}
	}
	if on {
		taints = append(taints, outOfService)
	}
	node.Spec.Taints = taints
	return cl.Patch(ctx, &node, patch)
}

// forEach runs fn for every item with at most n at once; the first error wins.
func forEach(ctx context.Context, items []string, n int, fn func(context.Context, string) error) error {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, it); err != nil {
				once.Do(func() { first = err })
			}
		}()
	}
	wg.Wait()
	return first
}

func cutoverTable(r *cutoverResult) *bench.Table {
	if r == nil {
		return nil
	}
	t := &bench.Table{
		Title:  fmt.Sprintf("2. Admin-state cut-over (ARM emulator adds %s to every call)", r.ARMLatency),
		Header: []string{"measure", "p50", "p99", "max", "n", "in ARM round trips (p50)"},
	}
	rt := func(d time.Duration) string { return fmt.Sprintf("%.1f", bench.Ratio(d, r.ARMLatency)) }
	t.AddRow("taint accepted → first PUT marking the node Down", bench.Millis(r.FirstPUT.P50), bench.Millis(r.FirstPUT.P99), bench.Millis(r.FirstPUT.Max), fmt.Sprint(r.FirstPUT.N), rt(r.FirstPUT.P50))
	t.AddRow(fmt.Sprintf("taint accepted → PUT in its last pool (%d pools)", r.PoolsNode), bench.Millis(r.AllPUTs.P50), bench.Millis(r.AllPUTs.P99), bench.Millis(r.AllPUTs.Max), fmt.Sprint(r.AllPUTs.N), rt(r.AllPUTs.P50))
	t.AddRow("same, tainted while the previous write (the untaint's PUT) is in flight", bench.Millis(r.Busy.P50), bench.Millis(r.Busy.P99), bench.Millis(r.Busy.Max), fmt.Sprint(r.Busy.N), rt(r.Busy.P50))
	t.Note("A PUT needs a fresh GET of its pool first, so the floor is 1 ARM round trip (the GET) plus the watch delay; \"first PUT\" is its arrival at the emulator.")
	for i, f := range r.Fleet {
		perPool := (f.Naive + f.Pools - 1) / f.Pools
		t.Note("%d nodes tainted at once (round %d, tainting took %s): %d PUTs (+%d GETs) vs %d for one PUT per node per pool (%.0f× fewer); all %d entries Down %s after the first taint, %s after the last was accepted. A naive updater serialised per pool by the ETag needs ≥ %d × (GET+PUT) = %s.",
			f.Nodes, i+1, bench.Seconds(f.TaintSpread), f.PUTs, f.GETs, f.Naive, float64(f.Naive)/float64(max(f.PUTs, 1)), f.Naive,
			bench.Seconds(f.AllDown), bench.Seconds(f.AfterAccept), perPool, bench.Seconds(time.Duration(perPool)*2*r.ARMLatency))
	}
	return t
}
