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
	"slices"
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

// Cut-over topology: dual-stack nodes, each in two pools of one load
// balancer, "kubernetes" (IPv4) and "kubernetes-IPv6", both carrying
// load-balancing rules, as on an AKS public load balancer. Their IPv4
// addresses are also in "aksOutboundBackendPool", which serves outbound rules
// only and gets no admin state. The probe node and every other fleet node are
// on load balancer "kubernetes", the rest on a second standard load balancer
// (cloud-provider-azure's multiple-SLB mode puts each node on one of them).
const (
	cutoverLabel = "bench.nodeguard.io/cutover"
	cutoverProbe = "cut-probe"
	poolsPerNode = 2
)

var cutoverLBs = []string{"kubernetes", "kubernetes-2"}

// cutoverPools are the pools that carry inbound traffic, and so admin state.
var cutoverPools = []string{"kubernetes", "kubernetes-IPv6"}

type cutoverNode struct{ name, v4, v6 string }

func cutoverSeed(nodes []cutoverNode) armemulator.Seed {
	seed := armemulator.Seed{Subscription: subscription, ResourceGroup: resourceGroup}
	for i, lb := range cutoverLBs {
		var v4, v6 []armemulator.EntrySeed
		for j, n := range nodes {
			if j%len(cutoverLBs) == i {
				v4 = append(v4, armemulator.EntrySeed{Name: n.name, IP: n.v4})
				v6 = append(v6, armemulator.EntrySeed{Name: n.name, IP: n.v6})
			}
		}
		seed.LoadBalancers = append(seed.LoadBalancers, armemulator.LoadBalancerSeed{Name: lb, Pools: []armemulator.PoolSeed{
			{Name: cutoverPools[0], Entries: v4},
			{Name: cutoverPools[1], Entries: v6},
			{Name: "aksOutboundBackendPool", OutboundOnly: true, Entries: v4},
		}})
	}
	return seed
}

// cutoverResult is the admin-state cut-over section: nodeguard and the
// comparator, each against its own emulator seeded alike.
type cutoverResult struct {
	ARMLatency time.Duration `json:"armLatency"`
	Topology   string        `json:"topology"`
	PoolsNode  int           `json:"poolsPerNode"`
	Nodeguard  *cutoverSide  `json:"nodeguard"`
	PerPool    *cutoverSide  `json:"onePoolWriterEach"`
}

// cutoverSide is what one updater measured.
type cutoverSide struct {
	Name     string        `json:"name"`
	FirstPUT bench.Summary `json:"taintToFirstDownPUT"`
	Applied  bench.Summary `json:"taintToDownInEveryPool"`
	Busy     bench.Summary `json:"taintToDownInEveryPoolWhileAWriteIsInFlight"`
	// Answers412 count the PUTs answered 412 Precondition Failed in the
	// trials and in the busy trials.
	Answers412     int             `json:"trials412"`
	BusyAnswers412 int             `json:"busyTrials412"`
	Fleet          []fleetRound    `json:"fleet"`
	Raw            []time.Duration `json:"rawTaintToDownInEveryPool"`

	emu *armemulator.Server
	rec *putRecorder
	url string
	srv *http.Server
}

type fleetRound struct {
	Nodes       int           `json:"nodes"`
	Pools       int           `json:"pools"`
	PUTs        int           `json:"puts"`
	GETs        int           `json:"gets"`
	Answers412  int           `json:"answers412"`
	Naive       int           `json:"naivePUTs"`
	AllDown     time.Duration `json:"firstTaintToAllDown"`
	AfterAccept time.Duration `json:"lastTaintAcceptedToAllDown"`
	TaintSpread time.Duration `json:"tainting"`
}

// newCutoverSide starts an emulator with the seed, every call delayed by
// latency, behind a recorder.
func newCutoverSide(name string, seed armemulator.Seed, latency time.Duration) (*cutoverSide, error) {
	emu := armemulator.New(seed, armemulator.Options{})
	emu.AddFault(armemulator.Fault{Delay: latency})
	s := &cutoverSide{Name: name, emu: emu, rec: &putRecorder{emu: emu, ch: make(chan struct{}, 1)}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.url = "http://" + l.Addr().String()
	s.srv = &http.Server{Handler: s.rec, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *cutoverSide) close() { _ = s.srv.Close() }

// inState reports whether every entry of the nodes in the inbound pools has
// the admin state.
func (s *cutoverSide) inState(nodes []string, state string) bool {
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	for _, p := range s.emu.State() {
		if !slices.Contains(cutoverPools, p.Pool) {
			continue
		}
		for _, e := range p.Entries {
			if want[e.Name] && e.AdminState != state {
				return false
			}
		}
	}
	return true
}

// answers412 is how many pool PUTs the emulator answered 412.
func (s *cutoverSide) answers412() int {
	return s.emu.Status(http.MethodPut, "/backendAddressPools/", http.StatusPreconditionFailed)
}

// putEvent is a backend pool PUT as the emulator received it, and its answer.
type putEvent struct {
	at     time.Time
	pool   string            // "lb/pool"
	states map[string]string // entry name -> admin state (None when unset)
	status int               // 0 while in flight
	done   time.Time
}

// putRecorder is an http.Handler in front of the emulator that records each
// pool PUT on arrival, before the emulator's added latency, and its answer,
// and counts the pool requests in flight.
type putRecorder struct {
	emu      *armemulator.Server
	mu       sync.Mutex
	put      []*putEvent
	get      int
	inFlight int
	// changed is, by pool and entry, the admin state the answered PUTs left
	// and when it last changed (entries start None).
	changed map[string]map[string]stateChange
	ch      chan struct{}
}

type stateChange struct {
	state string
	at    time.Time
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (p *putRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.ToLower(r.URL.Path)
	if !strings.Contains(path, "/backendaddresspools/") || (r.Method != http.MethodGet && r.Method != http.MethodPut) {
		p.emu.ServeHTTP(w, r)
		return
	}
	var ev *putEvent
	if r.Method == http.MethodPut {
		ev = parsePUT(r)
	}
	p.mu.Lock()
	p.inFlight++
	if ev != nil {
		p.put = append(p.put, ev)
	} else {
		p.get++
	}
	p.mu.Unlock()
	p.notify()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	p.emu.ServeHTTP(sw, r)
	p.mu.Lock()
	p.inFlight--
	if ev != nil {
		ev.status, ev.done = sw.status, time.Now()
		if ev.status >= 200 && ev.status < 300 {
			p.record(ev)
		}
	}
	p.mu.Unlock()
	p.notify()
}

// record notes the admin-state changes an applied PUT made. Call with p.mu
// held.
func (p *putRecorder) record(ev *putEvent) {
	if p.changed == nil {
		p.changed = map[string]map[string]stateChange{}
	}
	entries := p.changed[ev.pool]
	if entries == nil {
		entries = map[string]stateChange{}
		p.changed[ev.pool] = entries
	}
	for name, state := range ev.states {
		cur, ok := entries[name]
		if !ok {
			cur.state = "None"
		}
		if cur.state != state {
			entries[name] = stateChange{state: state, at: ev.done}
		}
	}
}

// parsePUT reads the admin states a pool PUT carries.
func parsePUT(r *http.Request) *putEvent {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var pool armnetwork.BackendAddressPool
	_ = json.Unmarshal(body, &pool)
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	ev := &putEvent{at: time.Now(), pool: parts[len(parts)-3] + "/" + parts[len(parts)-1], states: map[string]string{}}
	if pool.Properties != nil {
		for _, e := range pool.Properties.LoadBalancerBackendAddresses {
			if e != nil && e.Name != nil && e.Properties != nil {
				s := "None"
				if e.Properties.AdminState != nil && *e.Properties.AdminState != "" {
					s = string(*e.Properties.AdminState)
				}
				ev.states[*e.Name] = s
			}
		}
	}
	return ev
}

func (p *putRecorder) notify() {
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

func (p *putRecorder) counts() (puts, gets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.put), p.get
}

// poll calls cond with p.mu held after every request and at least every 50
// ms, until it reports done, for at most a minute.
func (p *putRecorder) poll(ctx context.Context, what string, cond func() bool) error {
	deadline := time.After(time.Minute)
	for {
		p.mu.Lock()
		done := cond()
		p.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-p.ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return fmt.Errorf("timed out waiting until %s", what)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// firstPUT waits for the first PUT since t that sets node to state, and
// returns its arrival.
func (p *putRecorder) firstPUT(ctx context.Context, t time.Time, node, state string) (time.Time, error) {
	var at time.Time
	err := p.poll(ctx, fmt.Sprintf("a PUT sets %s %s", node, state), func() bool {
		for _, e := range p.put {
			if !e.at.Before(t) && e.states[node] == state {
				at = e.at
				return true
			}
		}
		return false
	})
	return at, err
}

// settled waits until no pool request is in flight and the emulator holds
// every entry of nodes in state. It returns since when that holds, by the
// answered PUTs, but not before from: an entry that never left state counts
// from from (an updater that finds nothing to change writes nothing).
func (s *cutoverSide) settled(ctx context.Context, from time.Time, nodes []string, state string) (time.Time, error) {
	var since time.Time
	err := s.rec.poll(ctx, fmt.Sprintf("%d node(s) are %s", len(nodes), state), func() bool {
		if s.rec.inFlight > 0 || !s.inState(nodes, state) {
			return false
		}
		since = from
		for _, entries := range s.rec.changed {
			for _, n := range nodes {
				if c, ok := entries[n]; ok && c.state == state {
					since = latest(since, c.at)
				}
			}
		}
		return true
	})
	return since, err
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// runCutover measures nodeguard's taint watcher and admin-state manager, then
// the comparator (one writer per pool), against the ARM emulator with a fixed
// latency on every call, on the same nodes.
func runCutover(ctx context.Context, c config, env *harness.Env) (*cutoverResult, error) {
	nodes := make([]cutoverNode, 0, c.fleetNodes+1)
	for i := range c.fleetNodes + 1 {
		name := fmt.Sprintf("fleet-%03d", i-1)
		if i == 0 {
			name = cutoverProbe
		}
		n := cutoverNode{name: name, v4: fmt.Sprintf("10.30.%d.%d", i/200, i%200+10), v6: fmt.Sprintf("fd00:30::%x", i+10)}
		nodes = append(nodes, n)
		if err := create(ctx, env.Client, builder.Node(name, builder.WithLabels(managedLabel, "true", cutoverLabel, "true"),
			builder.WithInternalIP(n.v4), builder.WithInternalIP(n.v6))); err != nil {
			return nil, err
		}
	}
	var fleet []string
	for _, n := range nodes[1:] {
		fleet = append(fleet, n.name)
	}
	seed := cutoverSeed(nodes)
	r := &cutoverResult{ARMLatency: c.armLatency, PoolsNode: poolsPerNode,
		Topology: fmt.Sprintf("dual-stack nodes, each in pools %s of one of the load balancers %s (plus the outbound-only aksOutboundBackendPool)",
			strings.Join(cutoverPools, " and "), strings.Join(cutoverLBs, ", "))}

	ng, err := newCutoverSide("nodeguard", seed, c.armLatency)
	if err != nil {
		return nil, err
	}
	defer ng.close()
	proc, err := startNodeguard(c.nodeguard, env, env.Kubeconfig, ng.url, filepath.Join(env.Dir, "nodeguard-cutover.log"))
	if err != nil {
		return nil, err
	}
	logf("cutover: nodeguard, %d taint/untaint trials on one node, ARM latency %s", c.cutTrials, c.armLatency)
	err = measureCutover(ctx, c, env.Client, ng, fleet)
	proc.stop()
	r.Nodeguard = ng
	if err != nil {
		return r, fmt.Errorf("nodeguard: %w", err)
	}

	pp, err := newCutoverSide("one writer per pool", seed, c.armLatency)
	if err != nil {
		return r, err
	}
	defer pp.close()
	ppCtx, stop := context.WithCancel(ctx)
	defer stop()
	var pools []poolRef
	for _, lb := range cutoverLBs {
		for _, p := range cutoverPools {
			pools = append(pools, poolRef{lb: lb, name: p})
		}
	}
	if _, err := startPerPoolWriters(ppCtx, env.Config, cutoverLabel+"=true", pp.url, pools); err != nil {
		return r, err
	}
	// nodeguard without Azure still serves the node webhooks every taint
	// passes through, so that both runs see the same API server path.
	webhookOnly, err := startNodeguard(c.nodeguard, env, env.Kubeconfig, "", filepath.Join(env.Dir, "nodeguard-cutover-webhook-only.log"))
	if err != nil {
		return r, err
	}
	defer webhookOnly.stop()
	logf("cutover: one writer per pool, the same trials")
	err = measureCutover(ctx, c, env.Client, pp, fleet)
	r.PerPool = pp
	if err != nil {
		return r, fmt.Errorf("one writer per pool: %w", err)
	}
	return r, nil
}

// measureCutover runs the probe trials, the busy trials and the fleet rounds
// against one updater.
func measureCutover(ctx context.Context, c config, cl client.Client, s *cutoverSide, fleet []string) error {
	probe := []string{cutoverProbe}
	// trial taints the probe node and waits until it is Down in both its
	// pools, then untaints it and waits, unless busy, until it is None in
	// both again; a busy trial returns as soon as the untaint's first PUT
	// arrives, so that the next taint lands while that write is in flight.
	trial := func(busy bool) (first, applied time.Duration, err error) {
		sent := time.Now()
		if err := setTaint(ctx, cl, cutoverProbe, true); err != nil {
			return 0, 0, err
		}
		accepted := time.Now()
		downAt, err := s.settled(ctx, accepted, probe, "Down")
		if err != nil {
			return 0, 0, err
		}
		if !busy {
			firstAt, err := s.rec.firstPUT(ctx, sent, cutoverProbe, "Down")
			if err != nil {
				return 0, 0, err
			}
			first = max(firstAt.Sub(accepted), 0)
		}
		sent = time.Now()
		if err := setTaint(ctx, cl, cutoverProbe, false); err != nil {
			return 0, 0, err
		}
		if busy {
			_, err = s.rec.firstPUT(ctx, sent, cutoverProbe, "None")
		} else {
			_, err = s.settled(ctx, sent, probe, "None")
		}
		return first, max(downAt.Sub(accepted), 0), err
	}
	if _, _, err := trial(false); err != nil { // warm-up: pool discovery
		return err
	}
	var firsts, applied, busy []time.Duration
	before := s.answers412()
	for range c.cutTrials {
		f, a, err := trial(false)
		if err != nil {
			return err
		}
		firsts, applied = append(firsts, f), append(applied, a)
	}
	s.Answers412 = s.answers412() - before
	before = s.answers412()
	// The first busy trial's taint follows a settled untaint: not counted.
	for i := range c.cutTrials/2 + 1 {
		_, a, err := trial(true)
		if err != nil {
			return err
		}
		if i > 0 {
			busy = append(busy, a)
		}
	}
	// The last busy trial's untaint may still be in flight.
	if _, err := s.settled(ctx, time.Now(), probe, "None"); err != nil {
		return err
	}
	s.BusyAnswers412 = s.answers412() - before
	s.FirstPUT, s.Applied, s.Busy, s.Raw = bench.Summarize(firsts), bench.Summarize(applied), bench.Summarize(busy), applied

	logf("cutover: %s, %d nodes tainted at once, %d rounds", s.Name, len(fleet), c.fleetRounds)
	for range c.fleetRounds {
		fr, err := fleetRoundRun(ctx, cl, s, fleet)
		if err != nil {
			return err
		}
		s.Fleet = append(s.Fleet, fr)
	}
	return nil
}

func fleetRoundRun(ctx context.Context, cl client.Client, s *cutoverSide, names []string) (fleetRound, error) {
	fr := fleetRound{Nodes: len(names), Pools: len(cutoverLBs) * len(cutoverPools), Naive: poolsPerNode * len(names)}
	puts0, gets0 := s.rec.counts()
	failed0 := s.answers412()
	start := time.Now()
	if err := forEach(ctx, names, 20, func(ctx context.Context, n string) error { return setTaint(ctx, cl, n, true) }); err != nil {
		return fr, err
	}
	accepted := time.Now()
	fr.TaintSpread = accepted.Sub(start)
	done, err := s.settled(ctx, accepted, names, "Down")
	if err != nil {
		return fr, fmt.Errorf("waiting for %d nodes to be Down in every pool: %w", len(names), err)
	}
	fr.AllDown, fr.AfterAccept = done.Sub(start), done.Sub(accepted)
	puts, gets := s.rec.counts()
	fr.PUTs, fr.GETs, fr.Answers412 = puts-puts0, gets-gets0, s.answers412()-failed0
	if err := forEach(ctx, names, 20, func(ctx context.Context, n string) error { return setTaint(ctx, cl, n, false) }); err != nil {
		return fr, err
	}
	_, err = s.settled(ctx, time.Now(), names, "None")
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
	if r == nil || r.Nodeguard == nil {
		return nil
	}
	ng, pp := r.Nodeguard, r.PerPool
	if pp == nil {
		pp = &cutoverSide{Name: "one writer per pool"}
	}
	t := &bench.Table{
		Title: fmt.Sprintf("2. Admin-state cut-over: every node in %d pools of one load balancer (ARM emulator adds %s to every call)", r.PoolsNode, r.ARMLatency),
		Header: []string{"measure", "nodeguard p50", "nodeguard p99", "nodeguard 412s",
			pp.Name + " p50", pp.Name + " p99", pp.Name + " 412s", "n"},
	}
	cell := func(d time.Duration) string {
		return fmt.Sprintf("%s (%.1f calls)", bench.Millis(d), bench.Ratio(d, r.ARMLatency))
	}
	row := func(measure string, a, b bench.Summary, a412, b412 string) {
		t.AddRow(measure, cell(a.P50), cell(a.P99), a412, cell(b.P50), cell(b.P99), b412, fmt.Sprint(a.N))
	}
	row("taint accepted → first PUT marking the node Down (arrival)", ng.FirstPUT, pp.FirstPUT, "", "")
	row(fmt.Sprintf("taint accepted → Down answered in all %d pools", r.PoolsNode), ng.Applied, pp.Applied, fmt.Sprint(ng.Answers412), fmt.Sprint(pp.Answers412))
	row("same, tainted while the previous write (the untaint's PUT) is in flight", ng.Busy, pp.Busy, fmt.Sprint(ng.BusyAnswers412), fmt.Sprint(pp.BusyAnswers412))
	t.Note("Topology: %s. ARM keeps one ETag per load balancer, so a write to one of a node's pools changes the ETag the other reports: a second PUT with the ETag read before the first is answered 412 Precondition Failed.", r.Topology)
	t.Note("nodeguard writes the pools of one load balancer one after another, each after a fresh GET; the comparator writes every pool at once, each after its own GET, and retries a 412 at once after a fresh GET (nodeguard before the one-ETag rule waited 5 s). Each PUT needs a GET first, so Down in both pools costs at least 4 calls one way or the other; a 412 is a wasted PUT, and means the updater lost a race it started itself.")
	for _, s := range []*cutoverSide{ng, pp} {
		for i, f := range s.Fleet {
			perLB := (f.Naive + len(cutoverLBs) - 1) / len(cutoverLBs)
			t.Note("%s, %d nodes tainted at once across %d load balancers × %d pools (round %d, tainting took %s): %d PUTs (+%d GETs), %d answered 412, vs %d for one PUT per node per pool; all %d entries Down %s after the first taint, %s after the last was accepted (%.1f × (GET+PUT)). A naive updater, one PUT per node per pool and one at a time per load balancer (the shared ETag), needs ≥ %d × (GET+PUT) = %s.",
				s.Name, f.Nodes, len(cutoverLBs), len(cutoverPools), i+1, bench.Seconds(f.TaintSpread), f.PUTs, f.GETs, f.Answers412, f.Naive, f.Naive,
				bench.Seconds(f.AllDown), bench.Seconds(f.AfterAccept), bench.Ratio(f.AfterAccept, 2*r.ARMLatency), perLB, bench.Seconds(time.Duration(perLB)*2*r.ARMLatency))
		}
	}
	return t
}
