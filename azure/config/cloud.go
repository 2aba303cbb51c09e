package config

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
)

// clouds are the --azure-cloud names cloud-provider-azure knows (lower
// case), as the SDK configures them.
var clouds = map[string]cloud.Configuration{
	"azurepubliccloud":       cloud.AzurePublic,
	"azurecloud":             cloud.AzurePublic,
	"azurechinacloud":        cloud.AzureChina,
	"azureusgovernmentcloud": cloud.AzureGovernment,
	"azureusgovernment":      cloud.AzureGovernment,
}

// resolveCloud sets the cloud's endpoints: a known cloud's, with the
// authority host and the ARM endpoint (an emulator's, Azure Stack's) given
// over them.
func (c *Config) resolveCloud(name, endpoint, audience, authority string) error {
	if name == "" {
		name = "AzurePublicCloud"
	}
	base, ok := clouds[strings.ToLower(name)]
	if !ok && endpoint == "" {
		return &FieldError{Field: "cloud (--azure-cloud, $" + EnvCloud + ")", Reason: fmt.Sprintf("unknown cloud %q: use AzurePublicCloud, AzureChinaCloud or AzureUSGovernmentCloud, or give --azure-arm-endpoint", name)}
	}
	if !ok {
		base = cloud.AzurePublic
	}
	cfg := cloud.Configuration{ActiveDirectoryAuthorityHost: base.ActiveDirectoryAuthorityHost, Services: map[cloud.ServiceName]cloud.ServiceConfiguration{}}
	for k, v := range base.Services {
		cfg.Services[k] = v
	}
	if authority != "" {
		cfg.ActiveDirectoryAuthorityHost = authority
	}
	if endpoint != "" {
		u, err := url.Parse(endpoint)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
			return &FieldError{Field: "resourceManagerEndpoint (--azure-arm-endpoint, $" + EnvARMEndpoint + ")", Reason: fmt.Sprintf("%q is not an http(s) URL", endpoint)}
		}
		if audience == "" {
			audience = strings.TrimRight(endpoint, "/")
		}
		cfg.Services[cloud.ResourceManager] = cloud.ServiceConfiguration{Endpoint: endpoint, Audience: audience}
		c.InsecureAllowHTTP = u.Scheme == "http"
	}
	c.Cloud = cfg
	c.CloudName = name
	return nil
}
