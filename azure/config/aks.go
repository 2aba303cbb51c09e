package config

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
)

// AKS defaults.
const (
	// DefaultAgentPoolResync is --aks-agent-pool-resync's default: upgrade
	// settings change rarely, and an upgrade takes far longer.
	DefaultAgentPoolResync = 5 * time.Minute
	// DefaultUpgradeNodeTime is --upgrade-node-time's default.
	DefaultUpgradeNodeTime = 10 * time.Minute
)

// ManagedClusterType is the ARM resource type of an AKS cluster.
const ManagedClusterType = "Microsoft.ContainerService/managedClusters"

// ManagedCluster names an AKS managed cluster in ARM. Its resource group is
// the cluster's own, not the node resource group azure.json names.
type ManagedCluster struct {
	SubscriptionID string
	ResourceGroup  string
	Name           string
}

// ID is the cluster's ARM resource ID.
func (m ManagedCluster) ID() string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/%s/%s", m.SubscriptionID, m.ResourceGroup, ManagedClusterType, m.Name)
}

const managedClusterIDForm = "/subscriptions/<subscription>/resourceGroups/<resource group>/providers/Microsoft.ContainerService/managedClusters/<name>"

// ParseManagedCluster parses a managed cluster's ARM resource ID.
func ParseManagedCluster(id string) (*ManagedCluster, error) {
	rid, err := arm.ParseResourceID(strings.TrimSpace(id))
	if err != nil {
		return nil, fmt.Errorf("%q is not an ARM resource ID: want %s", id, managedClusterIDForm)
	}
	if !strings.EqualFold(rid.ResourceType.String(), ManagedClusterType) {
		return nil, fmt.Errorf("%q is a %s, not a managed cluster: want %s", id, rid.ResourceType, managedClusterIDForm)
	}
	if rid.SubscriptionID == "" || rid.ResourceGroupName == "" || rid.Name == "" {
		return nil, fmt.Errorf("%q lacks its subscription or resource group: want %s", id, managedClusterIDForm)
	}
	return &ManagedCluster{SubscriptionID: rid.SubscriptionID, ResourceGroup: rid.ResourceGroupName, Name: rid.Name}, nil
}

// errAKSNeedsAzure: the agent pools are read with the Azure credential.
var errAKSNeedsAzure = &FieldError{Field: "--aks-managed-cluster",
	Reason: "needs the Azure configuration for its credential: give azure.json (--azure-config) or --azure-subscription-id with a credential"}

func (o *Options) bindAKSFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.AKSManagedCluster, "aks-managed-cluster", o.AKSManagedCluster,
		"ARM resource ID of the AKS managed cluster ("+managedClusterIDForm+"; its own resource group, not the node resource group of azure.json). "+
			"When set, every replica reads the upgrade settings of its agent pools (maxSurge, maxUnavailable, drainTimeoutInMinutes, nodeSoakDurationInMinutes, undrainableNodeBehavior) "+
			"with the Azure credential, which needs Microsoft.ContainerService/managedClusters/agentPools/read, and each NodeDisruptionBudget reports whether an upgrade of its nodes' pools fits it "+
			"(status.agentPools, condition UpgradeSettingsFit, a warning when it is written). Requires the Azure configuration. Empty: off.")
	fs.DurationVar(&o.AKSAgentPoolResync, "aks-agent-pool-resync", o.AKSAgentPoolResync,
		"How often the agent pools of --aks-managed-cluster are read (once at start, then at this interval): a changed upgrade setting reaches the budgets within it.")
	fs.DurationVar(&o.UpgradeNodeTime, "upgrade-node-time", o.UpgradeNodeTime,
		"How long an AKS upgrade keeps one node out, from its first eviction until it is schedulable and Ready again (drain, reimage, boot); "+
			"nodeguard judges an agent pool's upgrade settings against its budgets with it.")
}

// loadAKS validates the AKS flags; the cluster is nil when none is given.
// A zero duration is its default (Options built without NewOptions).
func (o Options) loadAKS() (*ManagedCluster, error) {
	if o.UpgradeNodeTime < 0 {
		return nil, &FieldError{Field: "--upgrade-node-time", Reason: fmt.Sprintf("%s is negative", o.UpgradeNodeTime)}
	}
	if strings.TrimSpace(o.AKSManagedCluster) == "" {
		return nil, nil
	}
	mc, err := ParseManagedCluster(o.AKSManagedCluster)
	if err != nil {
		return nil, &FieldError{Field: "--aks-managed-cluster", Reason: err.Error()}
	}
	if o.AKSAgentPoolResync < 0 {
		return nil, &FieldError{Field: "--aks-agent-pool-resync", Reason: fmt.Sprintf("%s is negative", o.AKSAgentPoolResync)}
	}
	return mc, nil
}
