package agentpools

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/test/armemulator"
)

const clusterID = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1"

// load parses the flags as nodeguard does and resolves them.
func load(t *testing.T, args ...string) (*config.Config, error) {
	t.Helper()
	o := config.NewOptions()
	o.ConfigFile = ""
	o.Getenv = func(string) string { return "" }
	fs := flag.NewFlagSet("nodeguard", flag.ContinueOnError)
	o.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o.Load()
}

// From the flags to a read: --aks-managed-cluster names the cluster, its
// own subscription and resource group, apart from the node resource group.
func TestFlagsToARead(t *testing.T) {
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.Seed{Subscription: "sub", ResourceGroup: "MC_rg_aks1_westeurope",
		ManagedCluster: &armemulator.ManagedClusterSeed{Name: "aks1", ResourceGroup: "rg", AgentPools: []armemulator.AgentPoolSeed{{Name: "user", Count: 3}}},
	}, armemulator.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	cfg, err := load(t, "--azure-subscription-id=sub", "--azure-resource-group=MC_rg_aks1_westeurope", "--azure-credential=none",
		"--azure-arm-endpoint="+emu.URL(), "--aks-managed-cluster="+clusterID, "--aks-agent-pool-resync=1m")
	if err != nil {
		t.Fatal(err)
	}
	if mc := cfg.ManagedCluster; mc == nil || *mc != cluster || mc.ID() != clusterID || cfg.AgentPoolResync != time.Minute {
		t.Fatalf("ManagedCluster = %+v, resync %s", mc, cfg.AgentPoolResync)
	}
	p, err := FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.interval != time.Minute {
		t.Errorf("interval = %s", p.interval)
	}
	if err := p.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pools, _ := p.AgentPools(); len(pools) != 1 {
		t.Errorf("pools = %v", pools)
	}
}

func TestFlagsOff(t *testing.T) {
	cfg, err := load(t, "--azure-subscription-id=sub", "--azure-resource-group=MC", "--azure-credential=none")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ManagedCluster != nil {
		t.Errorf("ManagedCluster = %+v without the flag", cfg.ManagedCluster)
	}
	if p, err := FromConfig(cfg); p != nil || err != nil {
		t.Errorf("FromConfig = %v, %v; want nil, nil", p, err)
	}
}

// Zero durations are their defaults, as for Options built without
// NewOptions.
func TestFlagsZeroIsDefault(t *testing.T) {
	cfg, err := load(t, "--azure-subscription-id=sub", "--azure-resource-group=MC", "--azure-credential=none",
		"--aks-managed-cluster="+clusterID, "--aks-agent-pool-resync=0s", "--upgrade-node-time=0s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AgentPoolResync != DefaultInterval {
		t.Errorf("AgentPoolResync = %s, want %s", cfg.AgentPoolResync, DefaultInterval)
	}
}

func TestFlagErrors(t *testing.T) {
	azure := []string{"--azure-subscription-id=sub", "--azure-resource-group=MC", "--azure-credential=none"}
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"not a resource ID", []string{"--aks-managed-cluster=aks1"}, `"aks1" is not an ARM resource ID: want /subscriptions/`},
		{"an agent pool", []string{"--aks-managed-cluster=" + clusterID + "/agentPools/user"}, "is a Microsoft.ContainerService/managedClusters/agentPools, not a managed cluster"},
		{"a load balancer", []string{"--aks-managed-cluster=/subscriptions/sub/resourceGroups/MC/providers/Microsoft.Network/loadBalancers/kubernetes"}, "not a managed cluster"},
		{"no resource group", []string{"--aks-managed-cluster=/subscriptions/sub/providers/Microsoft.ContainerService/managedClusters/aks1"}, "lacks its subscription or resource group"},
		{"negative resync", []string{"--aks-managed-cluster=" + clusterID, "--aks-agent-pool-resync=-1m"}, "--aks-agent-pool-resync: -1m0s is negative"},
		{"negative node time", []string{"--upgrade-node-time=-1s"}, "--upgrade-node-time: -1s is negative"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, append(append([]string(nil), azure...), tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Load = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
	// Without Azure there is no credential to read with: an error, not
	// ErrNotConfigured (which would quietly turn the reads off).
	_, err := load(t, "--aks-managed-cluster="+clusterID)
	if err == nil || err == config.ErrNotConfigured || !strings.Contains(err.Error(), "--aks-managed-cluster: needs the Azure configuration") {
		t.Errorf("Load without Azure = %v", err)
	}
}
