package azure

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// setDownByOther sets a node's entry Down in one pool as another writer
// would (a person, another controller).
func (e *testEnv) setDownByOther(lb, pool, node string) {
	e.t.Helper()
	ok := e.emu.MutatePool(lb, pool, func(p *armnetwork.BackendAddressPool) {
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			if a.Name != nil && *a.Name == node {
				s := armnetwork.LoadBalancerBackendAddressAdminStateDown
				a.Properties.AdminState = &s
			}
		}
	})
	if !ok {
		e.t.Fatalf("no pool %s/%s", lb, pool)
	}
}

// recordedFor lists the pools whose record holds an entry for node.
func recordedFor(store *MemoryRecords, node string) []string {
	var out []string
	for pool, entries := range store.Entries() {
		for _, n := range entries {
			if n == node {
				out = append(out, pool)
				break
			}
		}
	}
	return out
}

// replacement is a node of the same name and address with a new UID, as
// a reimaged VMSS instance registers.
func replacement(n *corev1.Node) *corev1.Node {
	r := n.DeepCopy()
	r.UID = types.UID("new-" + string(n.UID))
	return r
}

func nodeReader(t *testing.T, nodes ...*corev1.Node) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s)
	for _, n := range nodes {
		b = b.WithObjects(n)
	}
	return b.Build()
}

// nodeguard restores None only where it set Down: a Down another writer set
// stays, whatever nodeguard wants for the node.
func TestDownSetBySomeoneElseIsNeverUndone(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 2, false, withManager(WithRecords(store)))
	n0, n1 := e.nodes[0], e.nodes[1]
	e.setDownByOther("kubernetes", "kubernetes", n1.Name)
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	if got := e.state("kubernetes", "kubernetes", n1.Name); got != "Down" {
		t.Fatalf("None for a node nodeguard never took Down changed another writer's Down to %s", got)
	}
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateDown)
	}
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantStates(n1.Name, AdminStateDown)
	e.wantConfirmed(n1, AdminStateDown)
	if got := recordedFor(store, n1.Name); len(got) != 1 || got[0] != "kubernetes-internal/kubernetes" {
		t.Errorf("n1 recorded in %v, want only the internal pool (the public entry was Down already)", got)
	}
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	e.wantConfirmed(n1, AdminStateNone)
	if got := e.state("kubernetes", "kubernetes", n1.Name); got != "Down" {
		t.Errorf("another writer's Down = %s after nodeguard's restore, want Down", got)
	}
	if got := e.state("kubernetes-internal", "kubernetes", n1.Name); got != "None" {
		t.Errorf("the Down nodeguard set = %s, want None", got)
	}
	if got := store.Entries(); len(got) != 0 {
		t.Errorf("records after every restore = %v, want none", got)
	}
}

// A node deleted while Down and re-registered under the same name (a new
// UID: VMSS reimage) gets its recorded entries back to None at once.
func TestReplacedNodeHasItsRecordedDownRestored(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 2, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	if got := recordedFor(store, n0.Name); len(got) != 2 {
		t.Fatalf("n0 recorded in %v, want both pools", got)
	}
	e.m.Forget(n0.UID)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown) // its VM may still be going away
	before := testutil.ToFloat64(goneRestored.WithLabelValues(dueReplaced))

	r := replacement(n0)
	e.m.SetDesired(r, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	e.wantConfirmed(r, AdminStateNone)
	if got := store.Entries(); len(got) != 0 {
		t.Errorf("records = %v, want none", got)
	}
	if got := testutil.ToFloat64(goneRestored.WithLabelValues(dueReplaced)) - before; got != 1 {
		t.Errorf("gone_node_restores_total{reason=replaced} +%v, want +1", got)
	}
	e.wantReasons(n0.Name, ReasonDown, ReasonRestoredAfterNodeGone)
	for _, ev := range e.rec.all() {
		if ev.reason == ReasonRestoredAfterNodeGone && !strings.Contains(ev.note, string(r.UID)) {
			t.Errorf("event %q does not name the replacement's UID", ev.note)
		}
	}
}

// A replacement that wants Down itself takes over the recorded entries (no
// write: they are Down), and its own None restores them.
func TestReplacementWantingDownTakesOverTheRecord(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 1, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.m.Forget(n0.UID)
	puts := e.emu.Count(http.MethodPut, "")
	r := replacement(n0)
	e.m.SetDesired(r, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantConfirmed(r, AdminStateDown)
	if got := e.emu.Count(http.MethodPut, "") - puts; got != 0 {
		t.Errorf("%d PUTs to take over entries that are Down already, want 0", got)
	}
	for pool, entries := range store.Entries() {
		for entry := range entries {
			if o := mustOwner(t, e.m, pool, entry); o.UID != r.UID {
				t.Errorf("%s/%s recorded for %s, want the replacement %s", pool, entry, o.UID, r.UID)
			}
		}
	}
	e.m.SetDesired(r, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := store.Entries(); len(got) != 0 {
		t.Errorf("records = %v, want none", got)
	}
}

func mustOwner(t *testing.T, m *Manager, pool, entry string) owner {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.recorded[pool][entry]
	if !ok {
		t.Fatalf("%s/%s not recorded", pool, entry)
	}
	return o
}

// A node that is gone for good has its recorded entries restored after the
// grace period, also when nodeguard restarted (crashed) in between and
// learns from the node list that the node is gone.
func TestGoneNodeIsRestoredAfterGraceAcrossRestarts(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 2, false, withManager(WithRecords(store), WithNodeReader(nodeReader(t))))
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)

	// Crash; the node is deleted meanwhile (the reader lists no node).
	e.m = e.remake()
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	for pool, entries := range store.Entries() {
		for entry := range entries {
			if o := mustOwner(t, e.m, pool, entry); o.GoneSince == "" {
				t.Errorf("%s/%s: since when the node is gone is not recorded", pool, entry)
			}
		}
	}
	grace := e.m.cfg.GoneNodeGrace
	e.step(grace / 2)

	// Another restart: the grace period goes on from the recorded time.
	e.m = e.remake()
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	before := testutil.ToFloat64(goneRestored.WithLabelValues(dueGone))
	e.step(grace / 2)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := store.Entries(); len(got) != 0 {
		t.Errorf("records = %v, want none", got)
	}
	if got := testutil.ToFloat64(goneRestored.WithLabelValues(dueGone)) - before; got != 1 {
		t.Errorf("gone_node_restores_total{reason=gone} +%v, want +1", got)
	}
	e.wantReasons(n0.Name, ReasonDown, ReasonRestoredAfterNodeGone)
}

// No Down is written before it is recorded: when the record cannot be
// saved, the write waits and is retried.
func TestNoDownWithoutARecord(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 1, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	store.Fail = errors.New("the API server is unavailable")
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.emu.Count(http.MethodPut, ""); got != 0 {
		t.Fatalf("%d PUTs while the record cannot be saved, want 0", got)
	}
	e.wantStates(n0.Name, AdminStateNone)
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	store.Fail = nil
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantConfirmed(n0, AdminStateDown)
}
