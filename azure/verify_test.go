package azure

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

// emuNodes lists test nodes as the cloud-provider-azure actor sees them.
func emuNodes(e *testEnv, extra ...armemulator.Node) []armemulator.Node {
	var out []armemulator.Node
	for _, n := range e.nodes {
		out = append(out, armemulator.Node{Name: n.Name, IPs: []string{n.Status.Addresses[0].Address}})
	}
	return append(out, extra...)
}

// revertsIn counts the reverts of held-down entries set Down again in a pool.
func revertsIn(pool string) float64 {
	return testutil.ToFloat64(reverts.WithLabelValues(pool, string(AdminStateDown)))
}

// TestVerifyUndoesStalePoolWrite: cloud-provider-azure reads the load
// balancers, nodeguard cuts a node, then cloud-provider-azure PUTs the pool
// as it read it (no If-Match) while adding a node that joined: the cut is
// undone. The next verification, one --azure-admin-state-verify-interval
// later, sets it Down again with one List, a Warning event naming the pool
// and a count; the joined node's entry stays as cloud-provider-azure wrote it.
// A node or Service change brings the verification forward.
func TestVerifyUndoesStalePoolWrite(t *testing.T) {
	e := newEnv(t, 3, false)
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	cp := armemulator.NewCloudProvider(e.emu)
	stale, err := cp.Read(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)

	joiner := armemulator.Node{Name: "joiner", IPs: []string{"10.224.9.9"}}
	if _, err := stale.EnsureHostsInPool(e.ctx, "kubernetes", "kubernetes", emuNodes(e, joiner)); err != nil {
		t.Fatal(err)
	}
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("the stale pool PUT left %s, want the cut undone (None)", got)
	}
	before := revertsIn("kubernetes/kubernetes")
	e.tick()
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("repaired before the verification was due: %s", got)
	}

	e.emu.ResetRequests()
	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	if got := e.state("kubernetes", "kubernetes", "joiner"); got != "None" {
		t.Errorf("the entry cloud-provider-azure added is %q, want it left None", got)
	}
	if got := e.emu.Count(http.MethodGet, "/loadBalancers"); got < 1 {
		t.Errorf("%d load-balancer reads, want the verification's List", got)
	}
	if got := e.gets(publicPool) + e.gets(internalPool); got != 1 {
		t.Errorf("%d pool GETs, want 1 (only the reverted pool is written, after a fresh Get)", got)
	}
	if got := revertsIn("kubernetes/kubernetes") - before; got != 1 {
		t.Errorf("reverts_total{pool=kubernetes/kubernetes} grew by %v, want 1", got)
	}
	var notes []string
	for _, ev := range e.rec.all() {
		if ev.node == n0.Name && ev.reason == ReasonReverted {
			notes = append(notes, ev.note)
			if ev.typ != "Warning" || !strings.Contains(ev.note, "kubernetes/kubernetes") {
				t.Errorf("%s event %q (%s): want a Warning naming the pool", ReasonReverted, ev.note, ev.typ)
			}
		}
	}
	if len(notes) != 1 {
		t.Errorf("%d %s events, want 1: %q", len(notes), ReasonReverted, notes)
	}
	if err := armemulator.OnlyAdminStateChanged(e.emu.History(), armemulator.ByNodeguard); err != nil {
		t.Error(err)
	}

	// Nothing reverted: the next verification reads and writes nothing.
	e.emu.ResetRequests()
	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	if got := e.puts(""); got != 0 {
		t.Errorf("%d PUTs with nothing reverted, want 0", got)
	}

	// A node or Service change brings the next verification forward.
	e.emu.MutatePool("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			a.Properties.AdminState = nil
		}
	})
	e.m.ClusterChanged()
	e.step(verifyAfterChange)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
}

// TestVerifyReadsNothingWhileNoNodeIsHeldDown: verification costs no read
// unless a node is held Down.
func TestVerifyReadsNothingWhileNoNodeIsHeldDown(t *testing.T) {
	e := newEnv(t, 2, false)
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.emu.ResetRequests()
	e.m.ClusterChanged()
	for range 3 {
		e.step(e.m.cfg.VerifyInterval)
		e.tick()
	}
	if got := len(e.emu.Requests()); got != 0 {
		t.Errorf("%d ARM requests with no node held Down, want 0", got)
	}
}

// TestVerifyWakesTheLoop: the running manager wakes for the verification on
// its own (no other work pending), so a revert is undone within one
// --azure-admin-state-verify-interval of (fake) time.
func TestVerifyWakesTheLoop(t *testing.T) {
	e := newEnv(t, 3, false)
	n0 := e.nodes[0]
	stale, err := armemulator.NewCloudProvider(e.emu).Read(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.m.Start(e.ctx) }()
	e.m.SetDesired(n0, AdminStateDown)
	waitFor(t, func() bool { return e.state("kubernetes", "kubernetes", n0.Name) == "Down" })
	if _, err := stale.EnsureHostsInPool(e.ctx, "kubernetes", "kubernetes", emuNodes(e, armemulator.Node{Name: "joiner", IPs: []string{"10.224.9.9"}})); err != nil {
		t.Fatal(err)
	}
	repaired := func() bool {
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			if e.state("kubernetes", "kubernetes", n0.Name) == "Down" {
				return true
			}
			time.Sleep(5 * time.Millisecond) // polling the emulator, not waiting for time to pass
		}
		return false
	}
	for elapsed := time.Second; !repaired(); elapsed += time.Second {
		if elapsed > e.m.cfg.VerifyInterval+time.Second {
			t.Fatalf("the revert is still there %s after it, want it undone within %s", elapsed, e.m.cfg.VerifyInterval)
		}
		e.step(time.Second)
	}
}

// TestWriteForOtherNodesCountsTheRevertItRepairs: another writer puts a
// held-down entry back to None, and before the next verification another
// node's cut writes the same pool: that write sets the reverted entry Down
// too, and says so as a verification would (event and count).
func TestWriteForOtherNodesCountsTheRevertItRepairs(t *testing.T) {
	e := newEnv(t, 3, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	stale, err := armemulator.NewCloudProvider(e.emu).Read(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	if _, err := stale.EnsureHostsInPool(e.ctx, "kubernetes", "kubernetes", emuNodes(e, armemulator.Node{Name: "joiner", IPs: []string{"10.224.9.9"}})); err != nil {
		t.Fatal(err)
	}
	before := revertsIn("kubernetes/kubernetes")
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(n1.Name, AdminStateDown)
	if got := revertsIn("kubernetes/kubernetes") - before; got != 1 {
		t.Errorf("reverts_total{pool=kubernetes/kubernetes} grew by %v, want 1", got)
	}
	e.wantReasons(n0.Name, ReasonDown, ReasonReverted)
}

// TestRevertsInTwoPoolsAreEachReported: cloud-provider-azure undoes the cut in
// both pools of a node (the public and the internal load balancer) between
// two verifications. The next one finds both: each pool gets its own
// LoadBalancerAdminStateReverted event and count, though they are found in
// the same round for the same node.
func TestRevertsInTwoPoolsAreEachReported(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	stale, err := armemulator.NewCloudProvider(e.emu).Read(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	pools := []string{"kubernetes", "kubernetes-internal"}
	before := map[string]float64{}
	for _, lb := range pools {
		before[lb] = revertsIn(lb + "/kubernetes")
		// A node joins: the actor PUTs the pool as it read it, before the cut.
		joiner := armemulator.Node{Name: "joiner", IPs: []string{"10.224.9.9"}}
		if _, err := stale.EnsureHostsInPool(e.ctx, lb, "kubernetes", emuNodes(e, joiner)); err != nil {
			t.Fatal(err)
		}
		if got := e.state(lb, "kubernetes", n0.Name); got != "None" {
			t.Fatalf("the stale PUT of %s left %s, want the cut undone (None)", lb, got)
		}
	}

	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	for _, lb := range pools {
		pool := lb + "/kubernetes"
		if got := revertsIn(pool) - before[lb]; got != 1 {
			t.Errorf("reverts_total{pool=%s} grew by %v, want 1", pool, got)
		}
		var named int
		for _, ev := range e.rec.all() {
			if ev.node == n0.Name && ev.reason == ReasonReverted && strings.Contains(ev.note, "Backend pool "+pool+":") {
				named++
			}
		}
		if named != 1 {
			t.Errorf("%d %s events naming %s, want 1", named, ReasonReverted, pool)
		}
	}
}
