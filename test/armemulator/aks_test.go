package armemulator

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/containerservice/armcontainerservice/v6"
)

func aksSeed() Seed {
	return Seed{Subscription: "sub", ResourceGroup: "MC_rg_aks1_westeurope", ManagedCluster: &ManagedClusterSeed{
		Name: "aks1", ResourceGroup: "rg", AgentPools: []AgentPoolSeed{
			{Name: "system", Count: 3, Mode: "System"},
			{Name: "user", Count: 10, VMSize: "Standard_D4s_v5", UpgradeSettings: AgentPoolUpgradeSettings{
				MaxSurge: "0", MaxUnavailable: "2", DrainTimeoutInMinutes: 45, NodeSoakDurationInMinutes: 5, UndrainableNodeBehavior: "Cordon",
			}},
		},
	}}
}

// The agent pools are served in the REST specification's shape
// (AgentPoolsList, AgentPoolsGet): id, name, type and properties, unset
// upgrade settings omitted.
func TestAgentPoolsShape(t *testing.T) {
	s, err := Start("127.0.0.1:0", aksSeed(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(s.URL() + path + "?api-version=2025-04-01")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&b)
		return resp.StatusCode, b
	}
	const cluster = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1"
	code, body := get(cluster + "/agentPools")
	var raw struct {
		Value    []map[string]any `json:"value"`
		NextLink *string          `json:"nextLink"`
	}
	if err := json.Unmarshal(body, &raw); code != 200 || err != nil || len(raw.Value) != 2 || raw.NextLink != nil {
		t.Fatalf("list = %d %s (%v)", code, body, err)
	}
	user := raw.Value[1]
	if user["id"] != "/subscriptions/sub/resourcegroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1/agentPools/user" ||
		user["name"] != "user" || user["type"] != AgentPoolType {
		t.Errorf("user pool = %v", user)
	}
	props := user["properties"].(map[string]any)
	for _, k := range []string{"count", "vmSize", "mode", "orchestratorVersion", "provisioningState"} {
		if props[k] == nil {
			t.Errorf("properties lack %s: %v", k, props)
		}
	}
	want := map[string]any{"maxSurge": "0", "maxUnavailable": "2", "drainTimeoutInMinutes": 45.0, "nodeSoakDurationInMinutes": 5.0, "undrainableNodeBehavior": "Cordon"}
	if got := props["upgradeSettings"]; !reflect.DeepEqual(got, want) {
		t.Errorf("upgradeSettings = %v, want %v", got, want)
	}
	if _, ok := raw.Value[0]["properties"].(map[string]any)["upgradeSettings"]; ok {
		t.Errorf("the system pool's unset upgradeSettings are not omitted: %v", raw.Value[0])
	}

	// The SDK's models read it (they lack maxUnavailable and
	// undrainableNodeBehavior: 2025-02-01).
	var list armcontainerservice.AgentPoolListResult
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	u := list.Value[1].Properties
	if *u.Count != 10 || *u.Mode != armcontainerservice.AgentPoolModeUser || *u.UpgradeSettings.MaxSurge != "0" || *u.UpgradeSettings.DrainTimeoutInMinutes != 45 {
		t.Errorf("SDK decodes %+v", u)
	}

	// One pool, case-insensitively; a change shows at once.
	if !s.SetAgentPoolUpgradeSettings("SYSTEM", AgentPoolUpgradeSettings{MaxSurge: "33%"}) || s.SetAgentPoolUpgradeSettings("nope", AgentPoolUpgradeSettings{}) {
		t.Error("SetAgentPoolUpgradeSettings found the wrong pools")
	}
	if p, ok := s.AgentPool("system"); !ok || p.UpgradeSettings.MaxSurge != "33%" || p.Count != 3 {
		t.Errorf("AgentPool = %+v, %v", p, ok)
	}
	if _, ok := s.AgentPool("nope"); ok {
		t.Error("AgentPool found an unknown pool")
	}
	code, body = get(strings.ToLower(cluster) + "/agentpools/system")
	var pool struct {
		Name       string                     `json:"name"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(body, &pool); code != 200 || err != nil || pool.Name != "system" || string(pool.Properties["upgradeSettings"]) != `{"maxSurge":"33%"}` {
		t.Errorf("get = %d %s", code, body)
	}

	// ARM's 404s.
	for path, wantCode := range map[string]string{
		"/subscriptions/other/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks1/agentPools":                  "SubscriptionNotFound",
		"/subscriptions/sub/resourceGroups/nope/providers/Microsoft.ContainerService/managedClusters/aks1/agentPools":                  "ResourceGroupNotFound",
		"/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks2/agentPools":                    "ResourceNotFound",
		"/subscriptions/sub/resourceGroups/MC_rg_aks1_westeurope/providers/Microsoft.ContainerService/managedClusters/aks1/agentPools": "ResourceNotFound",
		cluster + "/agentPools/nope": "NotFound",
	} {
		code, body := get(path)
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); code != 404 || err != nil || e.Error.Code != wantCode || e.Error.Message == "" {
			t.Errorf("GET %s = %d %s, want 404 %s", path, code, body, wantCode)
		}
	}
}

// The seed's slice stays the caller's.
func TestSetAgentPoolUpgradeSettingsCopiesTheSeed(t *testing.T) {
	seed := aksSeed()
	s := New(seed, Options{})
	s.SetAgentPoolUpgradeSettings("user", AgentPoolUpgradeSettings{})
	if seed.ManagedCluster.AgentPools[1].UpgradeSettings.MaxSurge != "0" {
		t.Error("SetAgentPoolUpgradeSettings wrote the caller's seed")
	}
}
