package azure

import (
	"testing"

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
