package azure

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestUnknownConfigurationIsSaid: a resource group or a configured load
// balancer that ARM does not know turns configuration_ready to 0 and is
// named (in the log, and in the event of a node found in no pool); the load
// balancers that exist are still managed; fixed, the gauge is 1 again.
func TestUnknownConfigurationIsSaid(t *testing.T) {
	e := newEnv(t, 1, false)
	n := e.nodes[0]
	unknown := func() string {
		e.m.mu.Lock()
		defer e.m.mu.Unlock()
		return e.m.unknown
	}

	e.m.cfg.ResourceGroup = "mc_missing"
	e.m.SetDesired(n, AdminStateDown)
	e.tick()
	if got := testutil.ToFloat64(configurationReady); got != 0 {
		t.Errorf("configuration_ready = %v with a missing resource group, want 0", got)
	}
	if got := unknown(); !strings.Contains(got, "resource group mc_missing") {
		t.Errorf("unknown = %q, want the missing resource group named", got)
	}

	e.m.cfg.ResourceGroup = testRG
	e.m.cfg.LoadBalancers = []string{"kubernetes", "kubernetez"}
	e.step(e.m.cfg.ResyncInterval)
	e.tick()
	if got := testutil.ToFloat64(configurationReady); got != 0 {
		t.Errorf("configuration_ready = %v with a missing load balancer, want 0", got)
	}
	if got := unknown(); !strings.Contains(got, "kubernetez") || strings.Contains(got, "kubernetes,") {
		t.Errorf("unknown = %q, want only kubernetez named", got)
	}
	e.wantConfirmed(n, AdminStateDown)
	if got := e.state("kubernetes", "kubernetes", n.Name); got != "Down" {
		t.Errorf("the load balancer that exists holds the node %q, want Down", got)
	}
	if e.m.NothingCut(n.UID) {
		t.Error("a node cut on the load balancer that exists is reported as nothing cut")
	}

	e.m.cfg.LoadBalancers = nil
	e.step(e.m.cfg.ResyncInterval)
	e.tick()
	if got := testutil.ToFloat64(configurationReady); got != 1 || unknown() != "" {
		t.Errorf("configuration_ready = %v, unknown %q once fixed; want 1 and nothing", got, unknown())
	}
}
