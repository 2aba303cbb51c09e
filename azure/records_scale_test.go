package azure

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

// recordScaleEnv sets the node count of TestRecordHoldsAWholePoolDown
// (5,000 without it, the target's whole fleet in one pool: about ten
// seconds, the control plane's start included).
const recordScaleEnv = "NODEGUARD_RECORD_NODES"

// apiServer starts a kube-apiserver (and etcd) for one test: the limits a
// record must fit in (256 KiB of annotations per object) are the API
// server's, which a fake client does not enforce.
func apiServer(t *testing.T) *harness.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a control plane (not with -short)")
	}
	env, err := harness.Start(context.Background(), harness.Options{})
	if env != nil {
		t.Cleanup(func() {
			if err := env.Stop(); err != nil {
				t.Logf("stopping the control plane: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("starting a control plane: %v", err)
	}
	return env
}

// recordLeases lists the record Leases of a pool.
func recordLeases(t *testing.T, c client.Reader, pool string) []coordinationv1.Lease {
	t.Helper()
	var list coordinationv1.LeaseList
	if err := c.List(context.Background(), &list, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace), client.MatchingLabels{recordLabel: recordLabelValue}); err != nil {
		t.Fatal(err)
	}
	var out []coordinationv1.Lease
	for _, l := range list.Items {
		if l.Annotations[recordPoolAnnotation] == pool {
			out = append(out, l)
		}
	}
	return out
}

// TestRecordHoldsAWholePoolDown: a zone outage or a large scale-down holds
// a whole pool of the 5,000-node target Down at once. Every node but one
// (held Down before, and after) is cut at once and then restored: every
// write lands, the record is saved on a real kube-apiserver (split over
// Leases, each within the object's annotation limit), and once the restore
// hold ends the record, its size metric and its Leases are what they were
// before.
func TestRecordHoldsAWholePoolDown(t *testing.T) {
	nodes := 5000
	if v := os.Getenv(recordScaleEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("%s=%q: want a node count", recordScaleEnv, v)
		}
		nodes = n
	}
	env := apiServer(t)
	// A pool of 5,000 entries is a body of megabytes: on a loaded machine
	// one try of its GET or PUT outlasts the test env's 2 s, as it would
	// not against ARM's own timeouts (azcore's default: none per try).
	e := newEnv(t, nodes, false, withManager(WithRecords(NewLeaseRecords(env.Client, env.Client, ngv1alpha1.MaintenanceLeaseNamespace)),
		WithSDKRetry(policy.RetryOptions{MaxRetries: 3, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond, TryTimeout: time.Minute})))
	n0 := e.nodes[0]
	for i, n := range e.nodes {
		n.UID = types.UID(fmt.Sprintf("%08x-5f7d-4e2a-9c61-%012x", i, i)) // as long as a real one
		e.m.SetDesired(n, AdminStateNone)
	}
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	if t.Failed() {
		logEvents(t, e) // why the write did not land
	}
	pools := []string{"kubernetes/kubernetes", "kubernetes-internal/kubernetes"}
	baseline := map[string]float64{}
	for _, pool := range pools {
		baseline[pool] = testutil.ToFloat64(recordBytes.WithLabelValues(pool))
		if baseline[pool] == 0 {
			t.Fatalf("record_bytes{pool=%s} = 0 with n0 recorded", pool)
		}
	}

	// Every other node at once.
	for _, n := range e.nodes[1:] {
		e.m.SetDesired(n, AdminStateDown)
	}
	e.tick()
	wantAll := func(state AdminState) {
		t.Helper()
		states := e.emu.AdminStates()
		wrong := 0
		for _, n := range e.nodes {
			for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
				if states[lb+"/kubernetes/"+n.Name] != string(state) {
					wrong++
				}
			}
		}
		if wrong > 0 {
			logEvents(t, e)
			t.Fatalf("%d entries not %s", wrong, state)
		}
	}
	wantAll(AdminStateDown)
	for _, n := range e.nodes {
		e.wantConfirmed(n, AdminStateDown)
	}
	for _, ev := range e.rec.all() {
		if ev.typ == corev1.EventTypeWarning {
			t.Fatalf("Warning %s %s: %s", ev.reason, ev.node, ev.note)
		}
	}
	// The record, as a restarted nodeguard reads it.
	loaded, unreadable, ignored, err := NewLeaseRecords(nil, env.Client, ngv1alpha1.MaintenanceLeaseNamespace).Load(e.ctx)
	if err != nil || len(unreadable) > 0 || len(ignored) > 0 {
		t.Fatalf("Load = %v, %v, %v", err, unreadable, ignored)
	}
	for _, pool := range pools {
		if got := len(loaded[pool]); got != nodes {
			t.Errorf("%s: %d entries recorded, want %d", pool, got, nodes)
		}
		leases := recordLeases(t, env.Client, pool)
		if len(leases) < 2 {
			t.Errorf("%s: record in %d Lease(s), want it split", pool, len(leases))
		}
		total := 0
		for _, l := range leases {
			size := 0
			for k, v := range l.Annotations {
				size += len(k) + len(v)
			}
			total += len(l.Annotations[recordEntriesAnnotation])
			if size > 256<<10 {
				t.Errorf("Lease %s holds %d bytes of annotations", l.Name, size)
			}
		}
		if total <= 256<<10 {
			t.Errorf("%s: record of %d bytes: the test does not need more than one Lease", pool, total)
		}
		t.Logf("%s: %d entries, %d bytes in %d Leases", pool, len(loaded[pool]), total, len(leases))
		if got := testutil.ToFloat64(recordShards.WithLabelValues(pool)); int(got) != len(leases) {
			t.Errorf("record_shards{pool=%s} = %v, want %d", pool, got, len(leases))
		}
	}

	// Every node but n0 back at once.
	for _, n := range e.nodes[1:] {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	states := e.emu.AdminStates()
	for _, n := range e.nodes[1:] {
		for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
			if got := states[lb+"/kubernetes/"+n.Name]; got != "None" {
				t.Fatalf("%s/kubernetes/%s = %s after the restore, want None", lb, n.Name, got)
			}
		}
		e.wantConfirmed(n, AdminStateNone)
	}
	e.wantStates(n0.Name, AdminStateDown)
	// Held restored for the hold, then dropped.
	e.step(e.m.cfg.RestoreHold)
	e.tick()
	for _, pool := range pools {
		if got := testutil.ToFloat64(recordBytes.WithLabelValues(pool)); got != baseline[pool] {
			t.Errorf("record_bytes{pool=%s} = %v after the cycle, want %v as before", pool, got, baseline[pool])
		}
		if leases := recordLeases(t, env.Client, pool); len(leases) != 1 || leases[0].Name != leaseName(pool) {
			t.Errorf("%s: record in %d Leases after the cycle, want the one it was in", pool, len(leases))
		}
	}
	loaded, _, _, err = NewLeaseRecords(nil, env.Client, ngv1alpha1.MaintenanceLeaseNamespace).Load(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, pool := range pools {
		if o, ok := loaded[pool][n0.Name]; len(loaded[pool]) != 1 || !ok || o.restored() {
			t.Errorf("%s record after the cycle = %d entries (n0: %+v), want n0 Down only", pool, len(loaded[pool]), o)
		}
	}
}

// TestRecordShardsLoadAndMigrate: a record of a single Lease, as written
// before records were sharded, loads and grows into shards; a record whose
// save failed half-way through a move to another shard count loses no
// entry; shard names nodeguard does not derive are ignored.
func TestRecordShardsLoadAndMigrate(t *testing.T) {
	e, c := leaseEnv(t)
	ctx := e.ctx
	pool := "kubernetes/kubernetes"
	rec := poolRecord{}
	for i := range 5 {
		name := fmt.Sprintf("node-%d", i)
		rec[name] = owner{UID: "uid-" + "x", Node: name}
	}
	// An old record: one Lease, no shard count.
	forgeRecord(t, c, leaseName(pool), pool, rec)
	store := NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace)
	got, _, ignored, err := store.Load(ctx)
	if err != nil || len(got[pool]) != 5 || len(ignored) != 0 {
		t.Fatalf("Load of a single-Lease record = %d entries, %v, ignored %v", len(got[pool]), err, ignored)
	}
	// Grow it past one shard.
	big := poolRecord{}
	for i := range 3000 {
		name := fmt.Sprintf("aks-nodepool1-12345678-vmss%06d", i)
		big[name] = owner{UID: "0b1c9a3e-5f7d-4e2a-9c61-7d3b2a1f0e9c", Node: name, RestoredAt: "2026-12-07T21:15:03Z"}
	}
	if err := store.Save(ctx, pool, big); err != nil {
		t.Fatalf("Save of %d entries: %v", len(big), err)
	}
	if n := len(recordLeases(t, c, pool)); n < 2 {
		t.Fatalf("%d Leases, want the record split", n)
	}
	got, _, _, err = NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace).Load(ctx)
	if err != nil || len(got[pool]) != len(big) {
		t.Fatalf("Load = %d entries, %v; want %d", len(got[pool]), err, len(big))
	}
	// A stray shard left over by a save that failed: its entries count
	// (union), a Down beating a restored copy.
	stray := poolRecord{"aks-nodepool1-12345678-vmss000001": {UID: "uid-other", Node: "other"}}
	forgeRecord(t, c, shardName(pool, maxRecordShards-1), pool, stray)
	// A name nodeguard does not derive.
	forgeRecord(t, c, leaseName(pool)+"-064", pool, poolRecord{"forged": {UID: "u", Node: "forged"}})
	got, _, ignored, err = NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace).Load(ctx)
	if err != nil || len(ignored) != 1 || ignored[0].Lease.Name != leaseName(pool)+"-064" {
		t.Fatalf("Load: %v, ignored %v", err, ignored)
	}
	if o := got[pool]["aks-nodepool1-12345678-vmss000001"]; o.UID != "uid-other" || o.restored() {
		t.Errorf("entry in two shards loaded as %+v, want the Down", o)
	}
	if _, ok := got[pool]["forged"]; ok {
		t.Error("the forged shard's entry loaded")
	}
	// Shrink back to one: the stray shard goes too.
	store = NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace)
	if _, _, _, err := store.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := store.Save(ctx, pool, rec); err != nil {
		t.Fatal(err)
	}
	leases := recordLeases(t, c, pool)
	names := []string{}
	for _, l := range leases {
		names = append(names, l.Name)
	}
	if len(leases) != 2 { // nodeguard's one, and the forged one it leaves alone
		t.Errorf("Leases after shrinking = %v, want %s and the forged one", names, leaseName(pool))
	}
	got, _, _, _ = NewLeaseRecords(c, c, ngv1alpha1.MaintenanceLeaseNamespace).Load(ctx)
	if len(got[pool]) != 5 {
		t.Errorf("Load after shrinking = %d entries, want 5", len(got[pool]))
	}
	// A record larger than every shard together fails to save, saying so.
	huge := poolRecord{}
	for i := range 60000 {
		name := fmt.Sprintf("aks-nodepool1-12345678-vmss%06d", i)
		huge[name] = owner{UID: "0b1c9a3e-5f7d-4e2a-9c61-7d3b2a1f0e9c", Node: name, RestoredAt: "2026-12-07T21:15:03Z"}
	}
	var tooLarge *RecordTooLargeError
	if err := store.Save(ctx, pool, huge); !errors.As(err, &tooLarge) {
		t.Errorf("Save of %d entries = %v, want a RecordTooLargeError", len(huge), err)
	}
}

// TestFailedSaveDoesNotBlockRestores: the record cannot be saved (the API
// server is down, or the record would not fit) when one node leaves and
// another comes back at once. The leaving node's Down waits for the record
// (no Down unrecorded) and is retried; the returning node's restore, planned
// beside it in the same pool write, is written anyway, and the record is
// fixed by the next save.
func TestFailedSaveDoesNotBlockRestores(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 2, false, withManager(WithRecords(store)))
	n0, n1 := e.nodes[0], e.nodes[1]
	e.m.SetDesired(n0, AdminStateDown)
	e.m.SetDesired(n1, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)

	store.Fail = errors.New("the record does not fit")
	e.m.SetDesired(n0, AdminStateNone)
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	e.wantConfirmed(n0, AdminStateNone)
	e.wantStates(n1.Name, AdminStateNone) // not Down unrecorded
	if got := recordedFor(store, n1.Name); len(got) != 0 {
		t.Errorf("n1 recorded in %v while the store fails", got)
	}
	e.wantReasons(n1.Name, ReasonUpdateRetrying)
	for _, ev := range e.rec.all() {
		if ev.node == n0.Name && ev.typ == corev1.EventTypeWarning {
			t.Errorf("Warning %s for the restored node: %s", ev.reason, ev.note)
		}
	}

	store.Fail = nil
	e.step(e.m.cfg.RetryInterval)
	e.tick()
	e.wantStates(n1.Name, AdminStateDown)
	e.wantConfirmed(n1, AdminStateDown)
	if got := recordedFor(store, n1.Name); len(got) != 2 {
		t.Errorf("n1 recorded in %v, want both pools", got)
	}
	// n0's restore, unrecorded when written, is recorded now: held None.
	for _, pool := range []string{"kubernetes/kubernetes", "kubernetes-internal/kubernetes"} {
		if got := store.Restored()[pool][n0.Name]; got != n0.Name {
			t.Errorf("%s: n0 not recorded restored after the next save (%v)", pool, store.Restored())
		}
	}
}

// logEvents logs the manager's events: a failed test says what its writes met.
func logEvents(t *testing.T, e *testEnv) {
	t.Helper()
	for _, ev := range e.rec.all() {
		t.Logf("event %s %s %s: %s", ev.typ, ev.reason, ev.node, ev.note)
	}
}
