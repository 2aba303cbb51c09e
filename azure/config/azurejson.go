package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"sigs.k8s.io/yaml"
)

// DefaultConfigFile is where AKS nodes keep the cloud provider config.
const DefaultConfigFile = "/etc/kubernetes/azure.json"

// File is azure.json. Keys match case-insensitively, as cloud-provider-azure
// parses them; the file may be JSON or YAML.
type File struct {
	Cloud                                 string `json:"cloud,omitempty"`
	TenantID                              string `json:"tenantId,omitempty"`
	SubscriptionID                        string `json:"subscriptionId,omitempty"`
	AADClientID                           string `json:"aadClientId,omitempty"`
	AADClientSecret                       string `json:"aadClientSecret,omitempty"`
	AADFederatedTokenFile                 string `json:"aadFederatedTokenFile,omitempty"`
	UseFederatedWorkloadIdentityExtension bool   `json:"useFederatedWorkloadIdentityExtension,omitempty"`
	ResourceGroup                         string `json:"resourceGroup,omitempty"`
	Location                              string `json:"location,omitempty"`
	VMType                                string `json:"vmType,omitempty"`
	UseManagedIdentityExtension           bool   `json:"useManagedIdentityExtension,omitempty"`
	UserAssignedIdentityID                string `json:"userAssignedIdentityID,omitempty"`
	LoadBalancerSku                       string `json:"loadBalancerSku,omitempty"`
	LoadBalancerResourceGroup             string `json:"loadBalancerResourceGroup,omitempty"`
	ResourceManagerEndpoint               string `json:"resourceManagerEndpoint,omitempty"`
	// LoadBalancerBackendPoolUpdateMaxRetries bounds admin-state retries of
	// retriable failures (nil: 3, 0: no retry, negative: 0). A pointer, so
	// that an explicit 0 survives loading.
	LoadBalancerBackendPoolUpdateMaxRetries *int `json:"loadBalancerBackendPoolUpdateMaxRetries,omitempty"`
	// AdminStateLoadBalancers (nodeguard's own key) names the load balancers
	// to manage; empty means all in the resource group.
	AdminStateLoadBalancers []string `json:"adminStateLoadBalancers,omitempty"`
}

// readFile reads azure.json at path, and reports whether there was one. A
// file missing at the default path is no error (with nothing else given,
// Load reports ErrNotConfigured); one missing at a path given is. An empty
// path reads none.
func readFile(path string) (File, bool, error) {
	var f File
	if path == "" {
		return f, false, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && path == DefaultConfigFile {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("azure config: reading %s (--azure-config): %w", path, err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return f, false, fmt.Errorf("azure config: %s (--azure-config) is empty", path)
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return f, false, fmt.Errorf("azure config: parsing %s (--azure-config): %w", path, err)
	}
	return f, true, nil
}
