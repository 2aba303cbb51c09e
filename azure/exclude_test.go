package azure

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

// excludeFromLB plays cloud-provider-azure on a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers: its next
// reconcile writes the IP-based pools without the node's entries.
func (e *testEnv) excludeFromLB(node *corev1.Node) {
	e.t.Helper()
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels[corev1.LabelNodeExcludeBalancers] = "true"
	snap, err := armemulator.NewCloudProvider(e.emu).Read(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var keep []armemulator.Node
	for _, n := range emuNodes(e) {
		if n.Name != node.Name {
			keep = append(keep, n)
		}
	}
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		if _, err := snap.EnsureHostsInPool(e.ctx, lb, "kubernetes", keep); err != nil {
			e.t.Fatal(err)
		}
		if got := e.state(lb, "kubernetes", node.Name); got != "" {
			e.t.Fatalf("%s/kubernetes still holds %s (%q) after cloud-provider-azure excluded it", lb, node.Name, got)
		}
	}
}

// TestMissingEntryOfAnExcludedNodeCountsAsCut: cloud-provider-azure removes
// the backend entries of a node labelled
// node.kubernetes.io/exclude-from-external-load-balancers, a harder cut than
// AdminState Down. Whether that happens after nodeguard's cut or before it,
// the node's traffic counts as cut (confirmed, no Warning), and nodeguard
// never puts an entry back.
func TestMissingEntryOfAnExcludedNodeCountsAsCut(t *testing.T) {
	for _, tt := range []struct {
		name          string
		excludedFirst bool
	}{
		{name: "entries removed after the cut"},
		{name: "entries removed before the cut", excludedFirst: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 3, false)
			n0 := e.nodes[0]
			for _, n := range e.nodes {
				e.m.SetDesired(n, AdminStateNone)
			}
			e.tick()
			if tt.excludedFirst {
				e.excludeFromLB(n0)
			}
			e.m.SetDesired(n0, AdminStateDown)
			e.tick()
			if !tt.excludedFirst {
				e.wantConfirmed(n0, AdminStateDown)
				e.excludeFromLB(n0)
			}
			e.emu.ResetRequests()
			e.m.ClusterChanged()
			e.step(e.m.cfg.VerifyInterval)
			e.tick()

			e.wantConfirmed(n0, AdminStateDown)
			for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
				if got := e.state(lb, "kubernetes", n0.Name); got != "" {
					t.Errorf("%s/kubernetes holds an entry of the excluded node again (%q)", lb, got)
				}
			}
			if got := e.puts(""); got != 0 {
				t.Errorf("%d PUTs after the node's entries went, want 0", got)
			}
			for _, ev := range e.rec.all() {
				if ev.node == n0.Name && ev.typ == corev1.EventTypeWarning {
					t.Errorf("Warning event %s for the excluded node: %s", ev.reason, ev.note)
				}
			}
		})
	}
}

// includeInLB plays cloud-provider-azure once the exclusion label is gone:
// its next reconcile adds the node's entries back, as new entries (no admin
// state).
func (e *testEnv) includeInLB(node *corev1.Node) {
	e.t.Helper()
	delete(node.Labels, corev1.LabelNodeExcludeBalancers)
	snap, err := armemulator.NewCloudProvider(e.emu).Read(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		if _, err := snap.EnsureHostsInPool(e.ctx, lb, "kubernetes", emuNodes(e)); err != nil {
			e.t.Fatal(err)
		}
		if got := e.state(lb, "kubernetes", node.Name); got == "" {
			e.t.Fatalf("%s/kubernetes holds no entry of %s after cloud-provider-azure added it back", lb, node.Name)
		}
	}
}

// settle runs the loop through a verification, the retry interval and a
// resync, as time passes.
func (e *testEnv) settle() {
	e.t.Helper()
	e.m.ClusterChanged()
	for range 3 {
		e.step(max(e.m.cfg.VerifyInterval, e.m.cfg.RetryInterval))
		e.tick()
	}
	e.step(e.m.cfg.ResyncInterval)
	e.tick()
}

// noWarnings fails on any Warning event about the node.
func (e *testEnv) noWarnings(node string) {
	e.t.Helper()
	for _, ev := range e.rec.all() {
		if ev.node == node && ev.typ == corev1.EventTypeWarning {
			e.t.Errorf("Warning event %s for %s: %s", ev.reason, node, ev.note)
		}
	}
}

// recordedAny lists the pools whose record holds an entry of the node,
// Down or restored.
func recordedAny(store *MemoryRecords, node string) []string {
	out := recordedFor(store, node)
	for pool, entries := range store.Restored() {
		for _, n := range entries {
			if n == node {
				out = append(out, pool+" (restored)")
				break
			}
		}
	}
	return out
}

// TestExcludedNodeComesBackWithNothingToRestore: Karpenter drains a node
// (the exclusion label) and cloud-provider-azure removes the entries
// nodeguard had cut; the node is then uncordoned (Karpenter gave up the
// disruption). Its entries are nothing to restore: no write, no failure, no
// retry, no entry added back, and the record forgets them. When
// cloud-provider-azure adds the entries back (the label gone), they are new:
// None, as the node's desired state, and nodeguard leaves them alone; a
// later cut records them afresh.
func TestExcludedNodeComesBackWithNothingToRestore(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 3, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantConfirmed(n0, AdminStateDown)
	e.excludeFromLB(n0)
	e.settle()
	e.wantConfirmed(n0, AdminStateDown)

	e.emu.ResetRequests()
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.wantConfirmed(n0, AdminStateNone)
	e.settle()
	if got := e.puts(""); got != 0 {
		t.Errorf("%d PUTs for a node whose entries left their pools, want 0", got)
	}
	for _, lb := range []string{"kubernetes", "kubernetes-internal"} {
		if got := e.state(lb, "kubernetes", n0.Name); got != "" {
			t.Errorf("%s/kubernetes holds an entry of n0 again (%q): nodeguard added it", lb, got)
		}
	}
	if got := recordedAny(store, n0.Name); len(got) != 0 {
		t.Errorf("n0 still recorded in %v, want its entries forgotten", got)
	}
	e.noWarnings(n0.Name)

	// The label goes: cloud-provider-azure adds the entries back, at None.
	e.includeInLB(n0)
	e.settle()
	e.wantStates(n0.Name, AdminStateNone)
	if got := e.puts(""); got != 2 {
		t.Errorf("%d PUTs, want cloud-provider-azure's 2 only", got)
	}
	// Someone else's Down on the new entry is theirs: no hold fights it.
	e.setDownByOther("kubernetes", "kubernetes", n0.Name)
	e.settle()
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("another writer's Down on the re-added entry = %s, want it left alone", got)
	}
	e.noWarnings(n0.Name)

	// A new cut takes the re-added entries as new ones.
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantConfirmed(n0, AdminStateDown)
	if got := recordedFor(store, n0.Name); len(got) != 1 || got[0] != "kubernetes-internal/kubernetes" {
		t.Errorf("n0 recorded in %v, want the internal pool (the public entry was someone else's Down)", got)
	}
}

// TestRestoredEntryRemovedByItsOwner: a restored entry held None (the
// restore hold) is removed by cloud-provider-azure (Karpenter drains the
// node again, with the exclusion label): the verification drops it from the
// record, with no event, and when it comes back it is a new entry, which the
// hold does not hold: a Down on it is someone else's.
func TestRestoredEntryRemovedByItsOwner(t *testing.T) {
	store := NewMemoryRecords()
	e := newEnv(t, 3, false, withManager(WithRecords(store)))
	n0 := e.nodes[0]
	for _, n := range e.nodes {
		e.m.SetDesired(n, AdminStateNone)
	}
	e.tick()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.m.SetDesired(n0, AdminStateNone)
	e.tick()
	e.wantStates(n0.Name, AdminStateNone)
	if got := len(store.Restored()); got != 2 {
		t.Fatalf("restored entries held in %d pools, want 2", got)
	}
	e.m.Forget(n0.UID) // as the taint watcher does once None is confirmed
	before := testutil.ToFloat64(reverts.WithLabelValues("kubernetes/kubernetes", string(AdminStateNone)))

	e.excludeFromLB(n0)
	e.emu.ResetRequests()
	e.m.ClusterChanged()
	e.step(e.m.cfg.VerifyInterval)
	e.tick()
	if got := recordedAny(store, n0.Name); len(got) != 0 {
		t.Errorf("n0 recorded in %v after its entries left their pools, want none", got)
	}
	if got := e.puts(""); got != 0 {
		t.Errorf("%d PUTs, want 0", got)
	}
	e.noWarnings(n0.Name)

	// Back within what was the hold's window, then Down by someone else.
	e.includeInLB(n0)
	e.setDownByOther("kubernetes", "kubernetes", n0.Name)
	e.settle()
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "Down" {
		t.Errorf("the re-added entry = %s, want another writer's Down left alone", got)
	}
	if got := testutil.ToFloat64(reverts.WithLabelValues("kubernetes/kubernetes", string(AdminStateNone))) - before; got != 0 {
		t.Errorf("reverts_total{state=None} +%v, want +0", got)
	}
	e.noWarnings(n0.Name)
}

// TestCutNoteSaysTheEntriesLeft: a node whose entries were removed by their
// owner counts as cut, and the note for its TrafficCut condition says so.
func TestCutNoteSaysTheEntriesLeft(t *testing.T) {
	for _, tt := range []struct {
		name          string
		excludedFirst bool
	}{
		{name: "removed after the cut"},
		{name: "removed before the cut", excludedFirst: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 3, false)
			n0, n1 := e.nodes[0], e.nodes[1]
			for _, n := range e.nodes {
				e.m.SetDesired(n, AdminStateNone)
			}
			e.tick()
			if tt.excludedFirst {
				e.excludeFromLB(n0)
				e.m.SetDesired(n0, AdminStateDown)
				e.tick()
			} else {
				e.m.SetDesired(n0, AdminStateDown)
				e.tick()
				e.excludeFromLB(n0)
				e.m.ClusterChanged()
				e.step(e.m.cfg.VerifyInterval)
				e.tick()
			}
			e.m.SetDesired(n1, AdminStateDown)
			e.tick()
			e.wantConfirmed(n0, AdminStateDown)
			note := e.m.CutNote(n0.UID)
			for _, want := range []string{"kubernetes/kubernetes", "kubernetes-internal/kubernetes", corev1.LabelNodeExcludeBalancers} {
				if !strings.Contains(note, want) {
					t.Errorf("CutNote = %q, want it to name %s", note, want)
				}
			}
			if note := e.m.CutNote(n1.UID); note != "" {
				t.Errorf("CutNote of a node cut as usual = %q, want empty", note)
			}
		})
	}
}
