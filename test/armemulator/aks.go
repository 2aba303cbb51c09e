// AKS: enough of Microsoft.ContainerService for nodeguard to read a managed
// cluster's agent pools and their upgrade settings (GET of the list and of
// one pool), in the shape of the REST specification's AgentPoolsGet and
// AgentPoolsList examples, and for tests to change the settings as
// `az aks nodepool update` would.

package armemulator

import (
	"fmt"
	"net/http"
	"strings"
)

// AgentPoolType is the ARM resource type of an agent pool.
const AgentPoolType = "Microsoft.ContainerService/managedClusters/agentPools"

// ManagedClusterSeed is an AKS managed cluster.
type ManagedClusterSeed struct {
	Name string `json:"name"`
	// ResourceGroup is the cluster's own resource group (the seed's when
	// empty; on AKS it differs from the node resource group).
	ResourceGroup string          `json:"resourceGroup,omitempty"`
	AgentPools    []AgentPoolSeed `json:"agentPools"`
}

// AgentPoolSeed is one agent pool.
type AgentPoolSeed struct {
	Name string `json:"name"`
	// Count is the pool's node count; VMSize (default Standard_DS2_v2),
	// Mode (System or User, default User) and OrchestratorVersion (default
	// 1.33.2) are reported as ARM reports them.
	Count               int32                    `json:"count"`
	VMSize              string                   `json:"vmSize,omitempty"`
	Mode                string                   `json:"mode,omitempty"`
	OrchestratorVersion string                   `json:"orchestratorVersion,omitempty"`
	UpgradeSettings     AgentPoolUpgradeSettings `json:"upgradeSettings"`
}

// AgentPoolUpgradeSettings are a pool's upgradeSettings in ARM's wire
// format: a zero field is unset, and omitted as ARM omits it.
type AgentPoolUpgradeSettings struct {
	MaxSurge                  string `json:"maxSurge,omitempty"`
	MaxUnavailable            string `json:"maxUnavailable,omitempty"`
	DrainTimeoutInMinutes     int32  `json:"drainTimeoutInMinutes,omitempty"`
	NodeSoakDurationInMinutes int32  `json:"nodeSoakDurationInMinutes,omitempty"`
	UndrainableNodeBehavior   string `json:"undrainableNodeBehavior,omitempty"`
}

// SetAgentPoolUpgradeSettings replaces a pool's upgrade settings. It reports
// whether the managed cluster has the pool.
func (s *Server) SetAgentPoolUpgradeSettings(pool string, u AgentPoolUpgradeSettings) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seed.ManagedCluster == nil {
		return false
	}
	for i, p := range s.seed.ManagedCluster.AgentPools {
		if strings.EqualFold(p.Name, pool) {
			s.seed.ManagedCluster.AgentPools[i].UpgradeSettings = u
			return true
		}
	}
	return false
}

// AgentPool returns the managed cluster's pool as the emulator holds it
// (case-insensitively), and whether there is one.
func (s *Server) AgentPool(name string) (AgentPoolSeed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seed.ManagedCluster != nil {
		for _, p := range s.seed.ManagedCluster.AgentPools {
			if strings.EqualFold(p.Name, name) {
				return p, true
			}
		}
	}
	return AgentPoolSeed{}, false
}

// cloneManagedCluster copies the seed's cluster, so that
// SetAgentPoolUpgradeSettings never writes the caller's slice.
func cloneManagedCluster(mc *ManagedClusterSeed, resourceGroup string) *ManagedClusterSeed {
	if mc == nil {
		return nil
	}
	c := *mc
	c.AgentPools = append([]AgentPoolSeed(nil), mc.AgentPools...)
	if c.ResourceGroup == "" {
		c.ResourceGroup = resourceGroup
	}
	return &c
}

// serveContainerService serves
//
//	GET /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.ContainerService/managedClusters/{c}/agentPools
//	GET .../agentPools/{pool}
//
// with ARM's 404s for an unknown subscription, resource group or cluster,
// and the resource provider's for an unknown pool. parts is the path split
// at "/", lower the same in lower case.
func (s *Server) serveContainerService(w http.ResponseWriter, r *http.Request, parts, lower []string) {
	rest := lower[6:]
	if r.Method != http.MethodGet || len(rest) < 3 || len(rest) > 4 || rest[0] != "managedclusters" || rest[2] != "agentpools" {
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" "+r.URL.Path)
		return
	}
	sub, rg, cluster := parts[1], parts[3], parts[7]
	s.mu.Lock()
	defer s.mu.Unlock()
	mc := s.seed.ManagedCluster
	switch {
	case !strings.EqualFold(sub, s.seed.Subscription):
		writeError(w, http.StatusNotFound, "SubscriptionNotFound", "The subscription '"+sub+"' could not be found.")
		return
	case !strings.EqualFold(rg, s.seed.ResourceGroup) && (mc == nil || !strings.EqualFold(rg, mc.ResourceGroup)):
		writeError(w, http.StatusNotFound, "ResourceGroupNotFound", "Resource group '"+rg+"' could not be found.")
		return
	case mc == nil || !strings.EqualFold(rg, mc.ResourceGroup) || !strings.EqualFold(cluster, mc.Name):
		writeError(w, http.StatusNotFound, "ResourceNotFound", "The Resource 'Microsoft.ContainerService/managedClusters/"+cluster+"' under resource group '"+rg+
			"' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
		return
	}
	if len(rest) == 3 {
		list := make([]map[string]any, 0, len(mc.AgentPools))
		for _, p := range mc.AgentPools {
			list = append(list, s.agentPool(p))
		}
		writeJSON(w, http.StatusOK, map[string]any{"value": list})
		return
	}
	for _, p := range mc.AgentPools {
		if strings.EqualFold(p.Name, parts[9]) {
			writeJSON(w, http.StatusOK, s.agentPool(p))
			return
		}
	}
	writeError(w, http.StatusNotFound, "NotFound", fmt.Sprintf("Agent pool '%s' was not found in managed cluster '%s'.", parts[9], mc.Name))
}

// agentPool is a pool as ARM returns it. Call with s.mu held.
func (s *Server) agentPool(p AgentPoolSeed) map[string]any {
	mc := s.seed.ManagedCluster
	vmSize, mode, version := p.VMSize, p.Mode, p.OrchestratorVersion
	if vmSize == "" {
		vmSize = "Standard_DS2_v2"
	}
	if mode == "" {
		mode = "User"
	}
	if version == "" {
		version = "1.33.2"
	}
	props := map[string]any{
		"provisioningState":          "Succeeded",
		"count":                      p.Count,
		"vmSize":                     vmSize,
		"maxPods":                    110,
		"type":                       "VirtualMachineScaleSets",
		"mode":                       mode,
		"osType":                     "Linux",
		"orchestratorVersion":        version,
		"currentOrchestratorVersion": version,
		"powerState":                 map[string]string{"code": "Running"},
	}
	if p.UpgradeSettings != (AgentPoolUpgradeSettings{}) {
		props["upgradeSettings"] = p.UpgradeSettings
	}
	return map[string]any{
		// AKS spells "resourcegroups" in lower case in the IDs it returns,
		// as the specification's examples do.
		"id":         fmt.Sprintf("/subscriptions/%s/resourcegroups/%s/providers/Microsoft.ContainerService/managedClusters/%s/agentPools/%s", s.seed.Subscription, mc.ResourceGroup, mc.Name, p.Name),
		"name":       p.Name,
		"type":       AgentPoolType,
		"properties": props,
	}
}
