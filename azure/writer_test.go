package azure

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

const (
	publicLB   = "/loadBalancers/kubernetes/"
	internalLB = "/loadBalancers/kubernetes-internal/"
)

// lbRequests returns the requests to one load balancer's pools, by arrival.
func (e *testEnv) lbRequests(lb string) []armemulator.Request {
	var out []armemulator.Request
	for _, r := range e.emu.Requests() {
		if strings.Contains(strings.ToLower(r.Path), strings.ToLower(lb)) && strings.Contains(r.Path, "/backendAddressPools/") {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// wantSerial checks that no two requests to one load balancer overlapped.
func (e *testEnv) wantSerial(lb string) {
	e.t.Helper()
	reqs := e.lbRequests(lb)
	for i := 1; i < len(reqs); i++ {
		if reqs[i].Start.Before(reqs[i-1].Time) {
			e.t.Errorf("%s %s started before %s %s was answered: writes to one load balancer overlap", reqs[i].Method, reqs[i].Path, reqs[i-1].Method, reqs[i-1].Path)
		}
	}
}

func (e *testEnv) want412s(want int) {
	e.t.Helper()
	if got := e.emu.Status("", "", http.StatusPreconditionFailed); got != want {
		e.t.Errorf("%d answers 412, want %d", got, want)
	}
}

// start runs the manager's loop until the test ends.
func (e *testEnv) start() {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { _ = e.m.Start(ctx); close(done) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

// A dual-stack node sits in two pools of each load balancer, which share the
// balancer's ETag: one writer per balancer writes them one after another,
// each with a fresh Get, so no write is refused.
func TestTwoPoolsOfOneLoadBalancerNo412(t *testing.T) {
	e := newEnv(t, 3, true)
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick() // discovery
	e.emu.ResetRequests()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		for _, pool := range []string{"kubernetes", "kubernetes-IPv6"} {
			if got := e.state(lb, pool, n0.Name); got != "Down" {
				t.Errorf("%s/%s/%s = %s, want Down", lb, pool, n0.Name, got)
			}
		}
	}
	e.wantConfirmed(n0, AdminStateDown)
	e.want412s(0)
	for _, lb := range []string{publicLB, internalLB} {
		if gets, puts := e.gets(lb), e.puts(lb); gets > 2 || puts > 2 {
			t.Errorf("%s: %d GETs and %d PUTs, want at most 2 × (GET + PUT)", lb, gets, puts)
		}
		e.wantSerial(lb)
	}
	e.wantReasons(n0.Name, ReasonDown)
}

// 100 nodes in 2 load balancers × 2 pools: the last taint arrives while both
// balancers have a write in flight; it goes into their next writes, right
// after (the fake clock never moves, so no retry timer can be what ran them):
// every node is Down within 2 round trips (GET + PUT per pool) of the last
// taint, with no 412.
func TestHundredNodesLastTaintWhileWritesAreInFlight(t *testing.T) {
	e := newEnv(t, 100, true)
	last := e.nodes[99]
	var (
		mu       sync.Mutex
		inFlight int
		taintAt  time.Time
		release  = make(chan struct{})
	)
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Times: 2, Delay: 2 * time.Millisecond, Before: func() {
		mu.Lock()
		inFlight++
		if inFlight == 2 {
			e.m.SetDesired(last, AdminStateDown)
			taintAt = time.Now()
			close(release)
		}
		mu.Unlock()
		<-release
	}})
	// Every call takes a while (added after the PUT fault: a request meets
	// only the first fault that matches it).
	e.emu.AddFault(armemulator.Fault{Delay: 2 * time.Millisecond})
	e.start()
	for _, n := range e.nodes[:99] {
		e.m.SetDesired(n, AdminStateDown)
	}
	<-release
	for _, n := range e.nodes {
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		err := e.m.WaitConfirmed(ctx, n.UID, AdminStateDown)
		cancel()
		if err != nil {
			t.Fatalf("WaitConfirmed(%s) = %v", n.Name, err)
		}
	}
	for _, p := range e.emu.State() {
		for _, entry := range p.Entries {
			if p.Pool != "aksOutboundBackendPool" && entry.AdminState != "Down" {
				t.Errorf("%s/%s/%s = %s, want Down", p.LoadBalancer, p.Pool, entry.Name, entry.AdminState)
			}
		}
	}
	e.want412s(0)
	for _, lb := range []string{publicLB, internalLB} {
		after := 0
		for _, r := range e.lbRequests(lb) {
			if r.Start.After(taintAt) {
				after++
			}
		}
		if after > 4 {
			t.Errorf("%s: %d requests after the last taint, want at most 2 × (GET + PUT)", lb, after)
		}
		e.wantSerial(lb)
	}
}

// A load balancer whose call hangs delays no other: the other's writer goes
// on, and takes new work too.
func TestSlowLoadBalancerDelaysNoOther(t *testing.T) {
	e := newEnv(t, 3, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick() // discovery
	answered := e.emu.Count(http.MethodGet, internalPool)
	hung := make(chan struct{})
	var once sync.Once
	e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: internalPool, Hang: true, Before: func() { once.Do(func() { close(hung) }) }})
	e.start()
	e.m.SetDesired(n0, AdminStateDown)
	<-hung
	waitFor(t, func() bool { return e.state("kubernetes", "kubernetes", n0.Name) == "Down" })
	e.m.SetDesired(n1, AdminStateDown)
	waitFor(t, func() bool { return e.state("kubernetes", "kubernetes", n1.Name) == "Down" })
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "None" {
		t.Errorf("hung pool = %s, want untouched", got)
	}
	if got := e.emu.Count(http.MethodGet, internalPool); got != answered {
		t.Errorf("%d answered GETs of the hung pool, want %d (still hanging)", got, answered)
	}
}

// A NIC-based pool that lists the node only in backendIPConfigurations has
// no entry to carry Down, and ARM does not let a client add one: the node is
// reported not Down, with a Warning event and a metric, never confirmed.
func TestNICMemberWithoutEntryIsNeverConfirmedDown(t *testing.T) {
	vmss := "azure:///subscriptions/" + testSub + "/resourceGroups/" + testRG + "/providers/Microsoft.Compute/virtualMachineScaleSets/aks-nodepool1-vmss/virtualMachines/"
	seedNodes := []armemulator.Node{
		{Name: "aks-nodepool1-vmss000000", IPs: []string{"10.224.0.4"}, ProviderID: vmss + "0"},
		{Name: "aks-nodepool1-vmss000001", IPs: []string{"10.224.0.5"}, ProviderID: vmss + "1"},
	}
	var nodes []*corev1.Node
	for _, n := range seedNodes {
		kn := testNode(n.Name, n.IPs...)
		kn.Spec.ProviderID = n.ProviderID
		nodes = append(nodes, kn)
	}
	e := newEnvWithSeed(t, armemulator.SeedForNodes(testSub, testRG, seedNodes, armemulator.Topology{NICBased: true, MembersOnly: true, Internal: true}), nodes)
	n0 := nodes[0]
	before := testutil.ToFloat64(noEntryDown.WithLabelValues("kubernetes/kubernetes"))
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("IP-based entry = %s, want Down", got)
	}
	if got := e.puts(publicPool); got != 0 {
		t.Errorf("%d PUTs to the pool without entries, want 0 (nothing to write)", got)
	}
	var ufe *UpdateFailedError
	var nee *NoEntryError
	err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown)
	if !errors.As(err, &ufe) || !errors.As(err, &nee) || nee.Pool != "kubernetes/kubernetes" {
		t.Fatalf("WaitConfirmed = %v, want an UpdateFailedError for the pool without an entry", err)
	}
	e.wantReasons(n0.Name, ReasonNoEntry)
	for _, ev := range e.rec.all() {
		if ev.reason == ReasonNoEntry && (ev.typ != corev1.EventTypeWarning || !strings.Contains(ev.note, "NOT Down")) {
			t.Errorf("no-entry event = %+v", ev)
		}
	}
	if got := testutil.ToFloat64(noEntryDown.WithLabelValues("kubernetes/kubernetes")) - before; got != 1 {
		t.Errorf("no-entry metric +%v, want +1", got)
	}
	// A resync looks again, without repeating the event.
	e.step(e.m.cfg.ResyncInterval)
	e.tick()
	e.wantReasons(n0.Name, ReasonNoEntry)
	if err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown); !errors.As(err, &nee) {
		t.Errorf("after resync WaitConfirmed = %v, want still not Down", err)
	}
	// None needs no entry: there is nothing that could be Down.
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.wantConfirmed(n0, AdminStateNone)
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "None" {
		t.Errorf("IP-based entry = %s, want None", got)
	}
}

// When the load balancers cannot be listed, every node waiting for them
// hears why.
func TestListFailureWarnsWaitingNodes(t *testing.T) {
	e := newEnv(t, 3, false)
	e.emu.AddFault(armemulator.Fault{Method: http.MethodGet, Path: "/providers/Microsoft.Network/loadBalancers", Status: http.StatusForbidden, Times: 1})
	for _, n := range e.nodes[:2] {
		e.m.SetDesired(n, AdminStateDown)
	}
	e.tick()
	for _, n := range e.nodes[:2] {
		e.wantReasons(n.Name, ReasonUpdateRetrying)
	}
	for _, ev := range e.rec.all() {
		if ev.typ != corev1.EventTypeWarning || !strings.Contains(ev.note, "Listing the load balancers") {
			t.Errorf("event = %+v, want a Warning about listing", ev)
		}
	}
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	for _, n := range e.nodes[:2] {
		e.wantStates(n.Name, AdminStateDown)
		e.wantReasons(n.Name, ReasonUpdateRetrying, ReasonDown)
	}
	e.wantReasons(e.nodes[2].Name)
}

// With no backend pool to be in (no load balancer yet, or none that carries
// inbound traffic), a node's state is confirmed at once, also when it comes
// after the first listing.
func TestNoPoolsConfirmsAtOnce(t *testing.T) {
	e := newEnvWithSeed(t, armemulator.Seed{Subscription: testSub, ResourceGroup: testRG}, nil)
	first := testNode("first", "10.224.0.4")
	e.m.SetDesired(first, AdminStateDown)
	e.tick()
	e.wantConfirmed(first, AdminStateDown)
	later := testNode("later", "10.224.0.5")
	e.m.SetDesired(later, AdminStateDown)
	e.wantConfirmed(later, AdminStateDown)
}
