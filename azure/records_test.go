package azure

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
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

// A record written before restored entries existed (no restoredAt) still
// loads, as entries set Down.
func TestOldRecordLoads(t *testing.T) {
	old := `{"10.224.0.4":{"uid":"uid-a","node":"a"},"10.224.0.5":{"uid":"uid-b","node":"b","goneSince":"2026-01-02T03:04:05Z"}}`
	pool := "kubernetes/kubernetes"
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName(pool),
		Annotations: map[string]string{recordPoolAnnotation: pool, recordEntriesAnnotation: old}}}
	got, rec, err := parseRecord(l)
	if err != nil || got != pool {
		t.Fatalf("parseRecord = %q, %v", got, err)
	}
	for name, o := range rec {
		if o.restored() {
			t.Errorf("%s loaded as restored, want Down: %+v", name, o)
		}
	}
	if rec["10.224.0.5"].GoneSince == "" || len(rec) != 2 {
		t.Errorf("record = %+v", rec)
	}
}

// leaseEnv is a manager whose records are Leases in a fake API server.
func leaseEnv(t *testing.T) (*testEnv, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).Build()
	return newEnv(t, 3, false, withManager(WithRecords(NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace)))), c
}

// forgeRecord writes a record Lease as anyone who may create Leases in the
// maintenance namespace could.
func forgeRecord(t *testing.T, c client.Client, name, pool string, entries map[string]owner) {
	t.Helper()
	data, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: name,
		Labels:      map[string]string{recordLabel: recordLabelValue},
		Annotations: map[string]string{recordPoolAnnotation: pool, recordEntriesAnnotation: string(data)}}}
	if err := c.Create(context.Background(), l); err != nil {
		t.Fatal(err)
	}
}

// TestForgedRecordIsIgnored: nodeguard holds n0 Down and someone else set
// n1 Down; a second record Lease for each pool, written by someone else,
// lists n1 as set Down by nodeguard (the public pool) and nothing (the
// internal pool). After a restart nodeguard reads only its own records: n0's
// None is restored in both pools, n1's Down is left alone, and each forged
// Lease gets one Warning LoadBalancerAdminStateRecordIgnored.
func TestForgedRecordIsIgnored(t *testing.T) {
	e, c := leaseEnv(t)
	n0, n1 := e.nodes[0], e.nodes[1]
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.setDownByOther("kubernetes", "kubernetes", n1.Name)

	// Names that sort after nodeguard's own, so a list takes them last.
	forged := map[string]string{"lb-admin-state-zz-public": "kubernetes/kubernetes", "lb-admin-state-zz-internal": "kubernetes-internal/kubernetes"}
	forgeRecord(t, c, "lb-admin-state-zz-public", "kubernetes/kubernetes", map[string]owner{n1.Name: {UID: n1.UID, Node: n1.Name}})
	forgeRecord(t, c, "lb-admin-state-zz-internal", "kubernetes-internal/kubernetes", map[string]owner{})
	before := testutil.ToFloat64(ignoredRecords)

	e.m = e.remake()
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := e.state("kubernetes", "kubernetes", n1.Name); got != "Down" {
		t.Errorf("n1 (Down by someone else, listed by a forged record) = %s, want Down", got)
	}
	for name := range forged {
		if got := e.countReasons(name, ReasonRecordIgnored); got != 1 {
			t.Errorf("%d %s events on Lease %s, want 1", got, ReasonRecordIgnored, name)
		}
	}
	if got := testutil.ToFloat64(ignoredRecords) - before; got != 2 {
		t.Errorf("ignored_records_total grew by %v, want 2", got)
	}
	downs, err := ListRecordedDowns(e.ctx, c, ngv1alpha1.MaintenanceLeaseNamespace)
	if err != nil || len(downs) != 0 {
		t.Errorf("ListRecordedDowns = %v, %v; want none (the forged records are not nodeguard's)", downs, err)
	}
	// The forged Leases are left as they are: not nodeguard's to write.
	for name := range forged {
		var l coordinationv1.Lease
		if err := c.Get(e.ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: name}, &l); err != nil {
			t.Errorf("forged Lease %s: %v", name, err)
		}
	}
}
