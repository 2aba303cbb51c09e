// Package config reads nodeguard's Azure configuration: azure.json (the file
// cloud-provider-azure reads on AKS nodes), overridden by environment
// variables and flags, and builds the azidentity credential in
// cloud-provider-azure's order.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"sigs.k8s.io/yaml"
)

// DefaultConfigFile is where AKS nodes keep the cloud provider config.
const DefaultConfigFile = "/etc/kubernetes/azure.json"

// Defaults.
const (
	DefaultMaxRetries     = 3
	DefaultResyncInterval = 5 * time.Minute
	DefaultRetryInterval  = 5 * time.Second
	DefaultRequestTimeout = 2 * time.Minute
	DefaultWorkers        = 4
	DefaultGoneNodeGrace  = 10 * time.Minute
	// DefaultVerifyInterval: how often the pools holding Down entries are
	// re-read while a node is leaving (one read per load balancer listed).
	DefaultVerifyInterval = 5 * time.Second
	// DefaultRestoreHold: how long an entry nodeguard restored to None is
	// watched for a stale write that puts it back Down. cloud-provider-azure
	// keeps a load balancer in its cache for up to 120 s and PUTs IP-based
	// pools from the copy its reconcile read, without If-Match; 3 minutes
	// covers the cache, the reconcile and a long operation.
	DefaultRestoreHold = 3 * time.Minute
)

// ErrNotConfigured means no Azure configuration was given at all: admin state
// is disabled.
var ErrNotConfigured = errors.New("no Azure configuration: load-balancer admin state is disabled")

// Credential kinds (--azure-credential).
const (
	CredentialAuto             = "auto"
	CredentialWorkloadIdentity = "workload-identity"
	CredentialManagedIdentity  = "managed-identity"
	CredentialClientSecret     = "client-secret"
	// CredentialNone sends a placeholder token: for ARM emulators only.
	CredentialNone = "none"
)

// Environment variables read (after azure.json, before flags).
const (
	EnvSubscriptionID      = "AZURE_SUBSCRIPTION_ID"
	EnvTenantID            = "AZURE_TENANT_ID"
	EnvClientID            = "AZURE_CLIENT_ID"
	EnvClientSecret        = "AZURE_CLIENT_SECRET"
	EnvFederatedTokenFile  = "AZURE_FEDERATED_TOKEN_FILE"
	EnvResourceGroup       = "AZURE_RESOURCE_GROUP"
	EnvCloud               = "AZURE_ENVIRONMENT"
	EnvARMEndpoint         = "AZURE_RESOURCE_MANAGER_ENDPOINT"
	EnvAuthorityHost       = "AZURE_AUTHORITY_HOST"
	EnvLoadBalancers       = "AZURE_LOAD_BALANCERS"
	EnvLoadBalancerRGroup  = "AZURE_LOAD_BALANCER_RESOURCE_GROUP"
	EnvAdminStateRetries   = "AZURE_ADMIN_STATE_MAX_RETRIES"
	EnvUserAssignedIdentty = "AZURE_USER_ASSIGNED_IDENTITY_ID"
)

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

// Options are the flags (see BindFlags). Empty strings mean "not set".
type Options struct {
	ConfigFile                string
	Cloud                     string
	ARMEndpoint               string
	ARMAudience               string
	AuthorityHost             string
	TenantID                  string
	SubscriptionID            string
	ClientID                  string
	ResourceGroup             string
	LoadBalancerResourceGroup string
	LoadBalancers             string
	Credential                string
	MaxRetries                OptionalInt
	ResyncInterval            time.Duration
	RetryInterval             time.Duration
	RequestTimeout            time.Duration
	Workers                   int
	GoneNodeGrace             time.Duration
	VerifyInterval            time.Duration
	RestoreHold               time.Duration
	// AKSManagedCluster, AKSAgentPoolResync and UpgradeNodeTime are the
	// AKS flags (aks.go).
	AKSManagedCluster  string
	AKSAgentPoolResync time.Duration
	UpgradeNodeTime    time.Duration

	// Getenv reads the environment (os.Getenv when nil; tests).
	Getenv func(string) string
}

// OptionalInt is an int flag that knows whether it was set.
type OptionalInt struct{ V *int }

func (o *OptionalInt) String() string {
	if o == nil || o.V == nil {
		return ""
	}
	return strconv.Itoa(*o.V)
}

// Set implements flag.Value.
func (o *OptionalInt) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	o.V = &v
	return nil
}

// NewOptions returns Options with the defaults.
func NewOptions() Options {
	return Options{
		ConfigFile:     DefaultConfigFile,
		Credential:     CredentialAuto,
		ResyncInterval: DefaultResyncInterval,
		RetryInterval:  DefaultRetryInterval,
		RequestTimeout: DefaultRequestTimeout,
		Workers:        DefaultWorkers,
		GoneNodeGrace:  DefaultGoneNodeGrace,
		VerifyInterval: DefaultVerifyInterval,
		RestoreHold:    DefaultRestoreHold,

		AKSAgentPoolResync: DefaultAgentPoolResync,
		UpgradeNodeTime:    DefaultUpgradeNodeTime,
	}
}

// BindFlags registers the flags on fs. Set defaults first (NewOptions).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "azure-config", o.ConfigFile,
		"Path of the cloud provider config (azure.json: cloud, tenantId, subscriptionId, aadClientId, aadClientSecret, resourceGroup, useManagedIdentityExtension, userAssignedIdentityID, ...; keys are case-insensitive). A missing file at the default path, with no subscription given otherwise, disables load-balancer admin state; an empty value never reads a file.")
	fs.StringVar(&o.Cloud, "azure-cloud", o.Cloud,
		"Azure cloud: AzurePublicCloud, AzureChinaCloud or AzureUSGovernmentCloud (overrides azure.json 'cloud' and $"+EnvCloud+"; default AzurePublicCloud).")
	fs.StringVar(&o.ARMEndpoint, "azure-arm-endpoint", o.ARMEndpoint,
		"Azure Resource Manager endpoint URL, for sovereign clouds, Azure Stack or an ARM emulator (overrides azure.json 'resourceManagerEndpoint' and $"+EnvARMEndpoint+"). An http:// endpoint allows sending the token over plain HTTP.")
	fs.StringVar(&o.ARMAudience, "azure-arm-audience", o.ARMAudience,
		"Token audience for --azure-arm-endpoint (default: the endpoint itself).")
	fs.StringVar(&o.AuthorityHost, "azure-authority-host", o.AuthorityHost,
		"Microsoft Entra authority host URL (https) for a custom cloud (default: the cloud's, or $"+EnvAuthorityHost+").")
	fs.StringVar(&o.TenantID, "azure-tenant-id", o.TenantID, "Tenant ID (overrides azure.json 'tenantId' and $"+EnvTenantID+").")
	fs.StringVar(&o.SubscriptionID, "azure-subscription-id", o.SubscriptionID,
		"Subscription of the cluster's load balancers (overrides azure.json 'subscriptionId' and $"+EnvSubscriptionID+"). Giving it enables admin state even without azure.json.")
	fs.StringVar(&o.ClientID, "azure-client-id", o.ClientID,
		"Client ID for workload identity or a client secret (overrides azure.json 'aadClientId' and $"+EnvClientID+"). The secret itself is read only from azure.json or $"+EnvClientSecret+".")
	fs.StringVar(&o.ResourceGroup, "azure-resource-group", o.ResourceGroup,
		"Resource group of the cluster's load balancers (the node resource group on AKS; overrides azure.json 'resourceGroup' and $"+EnvResourceGroup+").")
	fs.StringVar(&o.LoadBalancerResourceGroup, "azure-load-balancer-resource-group", o.LoadBalancerResourceGroup,
		"Resource group of the load balancers when it differs from --azure-resource-group (azure.json 'loadBalancerResourceGroup').")
	fs.StringVar(&o.LoadBalancers, "azure-load-balancers", o.LoadBalancers,
		"Comma-separated names of the load balancers whose backend pools get admin state (e.g. kubernetes,kubernetes-internal). Empty: every load balancer in the resource group.")
	fs.StringVar(&o.Credential, "azure-credential", o.Credential,
		"How to authenticate: auto (workload identity if a federated token file is configured, else managed identity if useManagedIdentityExtension, else client secret), workload-identity, managed-identity, client-secret, or none (a placeholder token, for an ARM emulator only).")
	fs.Var(&o.MaxRetries, "azure-admin-state-max-retries",
		"Retries of a backend pool update after a retriable failure (the subscription's 429, 409, a canceled write) before the entry is reported failed with a LoadBalancerAdminStateUpdateFailed event and tried again with a backoff (twice --azure-admin-state-retry-interval, doubling up to 1m); "+
			"a load balancer busy with another operation (429 RetryableError) and a 412 spend none. 0 disables retries, negative means 0 (overrides azure.json 'loadBalancerBackendPoolUpdateMaxRetries'; default 3).")
	fs.DurationVar(&o.ResyncInterval, "azure-admin-state-resync", o.ResyncInterval,
		"How often every backend pool is re-read and desired admin state re-applied, which repairs pools another writer rewrote.")
	fs.DurationVar(&o.RetryInterval, "azure-admin-state-retry-interval", o.RetryInterval,
		"Wait before retrying a backend pool update that failed retriably (a 429's Retry-After, when later, wins).")
	fs.DurationVar(&o.RequestTimeout, "azure-request-timeout", o.RequestTimeout,
		"Bound on one attempt at a backend pool (its GET, NIC lookups, PUT and the polling of a long-running write, "+
			"with the SDK's own retries). Each try of a call gets a quarter of it, so a hung try is tried again within the attempt; "+
			"an attempt that runs out is retried after --azure-admin-state-retry-interval.")
	fs.IntVar(&o.Workers, "azure-admin-state-workers", o.Workers, "How many backend pools are updated in parallel.")
	fs.DurationVar(&o.GoneNodeGrace, "azure-admin-state-gone-node-grace", o.GoneNodeGrace,
		"How long the backend entries nodeguard set Down stay Down after their node is gone (its VM may still be shutting down); "+
			"then nodeguard restores None on them. A node of the same name that registers again (a new UID) restores them at once.")
	fs.DurationVar(&o.RestoreHold, "azure-admin-state-restore-hold", o.RestoreHold,
		"How long an entry nodeguard restored to None (a drain called off, a signal taint gone) stays recorded and verified: another writer that PUTs the pool from a copy read while the node was Down "+
			"(cloud-provider-azure keeps a load balancer in its cache for up to 120s and writes IP-based pools without If-Match) puts it back Down, and nodeguard sets None again within --azure-admin-state-verify-interval "+
			"(Warning event LoadBalancerAdminStateReverted). Keep it longer than that writer's cache and reconcile. It ends early when the node is Down again, is deleted, or carries a taint cloud-provider-azure sets Down on. "+
			"0 stops at the restore; negative is an error.")
	fs.DurationVar(&o.VerifyInterval, "azure-admin-state-verify-interval", o.VerifyInterval,
		"While any node is held Down, or a restored entry is held None (--azure-admin-state-restore-hold), how often the load balancers holding its entries are re-read (one List of the resource group, or one GET per --azure-load-balancers name) "+
			"to catch another writer (cloud-provider-azure) that put an entry back to None, or a restored one back to Down; such an entry is set again at once (Warning event LoadBalancerAdminStateReverted). "+
			"A node joining or leaving the cluster, or a LoadBalancer Service changing, brings the next read forward to 2s later. 0 turns it off (only --azure-admin-state-resync repairs).")
	o.bindAKSFlags(fs)
}

// Config is the resolved configuration.
type Config struct {
	Cloud             cloud.Configuration
	CloudName         string
	InsecureAllowHTTP bool

	SubscriptionID string
	TenantID       string
	// ResourceGroup holds the load balancers.
	ResourceGroup string
	// LoadBalancers to manage; empty: all in ResourceGroup.
	LoadBalancers []string

	Credential CredentialConfig

	MaxRetries     int
	ResyncInterval time.Duration
	RetryInterval  time.Duration
	RequestTimeout time.Duration
	Workers        int
	GoneNodeGrace  time.Duration
	// VerifyInterval: re-reads of the pools holding Down entries; 0 is off.
	VerifyInterval time.Duration
	// RestoreHold: how long a restored None is verified; 0 is off.
	RestoreHold time.Duration

	// ManagedCluster is --aks-managed-cluster, whose agent pools' upgrade
	// settings are read every AgentPoolResync; nil: none are read.
	ManagedCluster  *ManagedCluster
	AgentPoolResync time.Duration
}

// CredentialConfig says how to authenticate.
type CredentialConfig struct {
	// Kind is the chosen kind (never CredentialAuto).
	Kind          string
	TenantID      string
	ClientID      string
	ClientSecret  string
	TokenFile     string
	AuthorityHost string
	// ManagedIdentityID is a user-assigned identity: a resource ID when it
	// contains "/subscriptions/", else a client ID; empty: system-assigned.
	ManagedIdentityID string
}

// FieldError is a configuration value that cannot work.
type FieldError struct {
	// Field names the setting as azure.json spells it, with its flag and
	// environment variable.
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "azure config: " + e.Field + ": " + e.Reason }

// Load reads and resolves the configuration. It returns ErrNotConfigured when
// no Azure configuration was given at all.
func (o Options) Load() (*Config, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	aks, err := o.loadAKS()
	if err != nil {
		return nil, err
	}
	f, found, err := readFile(o.ConfigFile)
	if err != nil {
		return nil, err
	}
	pick := func(flagV, envName, fileV string) string {
		if flagV != "" {
			return flagV
		}
		if v := getenv(envName); v != "" {
			return v
		}
		return fileV
	}
	subscription := pick(o.SubscriptionID, EnvSubscriptionID, f.SubscriptionID)
	endpoint := pick(o.ARMEndpoint, EnvARMEndpoint, f.ResourceManagerEndpoint)
	if !found && subscription == "" && endpoint == "" {
		if aks != nil {
			return nil, errAKSNeedsAzure
		}
		return nil, ErrNotConfigured
	}
	c := &Config{
		SubscriptionID: subscription,
		TenantID:       pick(o.TenantID, EnvTenantID, f.TenantID),
		ResourceGroup:  pick(o.ResourceGroup, EnvResourceGroup, f.ResourceGroup),
		ResyncInterval: o.ResyncInterval,
		RetryInterval:  o.RetryInterval,
		RequestTimeout: o.RequestTimeout,
		Workers:        o.Workers,
		GoneNodeGrace:  o.GoneNodeGrace,
		VerifyInterval: o.VerifyInterval,
		RestoreHold:    o.RestoreHold,

		ManagedCluster:  aks,
		AgentPoolResync: o.AKSAgentPoolResync,
	}
	if c.RestoreHold < 0 {
		return nil, &FieldError{Field: "--azure-admin-state-restore-hold", Reason: fmt.Sprintf("%s is negative: give 0 to stop watching restored entries at once", c.RestoreHold)}
	}
	if lbrg := pick(o.LoadBalancerResourceGroup, EnvLoadBalancerRGroup, f.LoadBalancerResourceGroup); lbrg != "" {
		c.ResourceGroup = lbrg
	}
	if c.SubscriptionID == "" {
		return nil, &FieldError{Field: "subscriptionId (--azure-subscription-id, $" + EnvSubscriptionID + ")", Reason: "is required"}
	}
	if c.ResourceGroup == "" {
		return nil, &FieldError{Field: "resourceGroup (--azure-resource-group, $" + EnvResourceGroup + ")", Reason: "is required: it holds the cluster's load balancers"}
	}
	lbs := pick(o.LoadBalancers, EnvLoadBalancers, strings.Join(f.AdminStateLoadBalancers, ","))
	for _, n := range strings.Split(lbs, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.LoadBalancers = append(c.LoadBalancers, n)
		}
	}
	maxRetries := f.LoadBalancerBackendPoolUpdateMaxRetries
	if v := getenv(EnvAdminStateRetries); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, &FieldError{Field: "loadBalancerBackendPoolUpdateMaxRetries ($" + EnvAdminStateRetries + ")", Reason: fmt.Sprintf("%q is not an integer", v)}
		}
		maxRetries = &n
	}
	if o.MaxRetries.V != nil {
		maxRetries = o.MaxRetries.V
	}
	c.MaxRetries = NormalizeMaxRetries(maxRetries)
	if err := c.resolveCloud(pick(o.Cloud, EnvCloud, f.Cloud), endpoint, o.ARMAudience, pick(o.AuthorityHost, EnvAuthorityHost, "")); err != nil {
		return nil, err
	}
	cred, err := chooseCredential(o, f, getenv, c)
	if err != nil {
		return nil, err
	}
	c.Credential = cred
	if c.ResyncInterval <= 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.GoneNodeGrace < 0 {
		c.GoneNodeGrace = 0
	}
	if c.VerifyInterval < 0 {
		c.VerifyInterval = 0
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.AgentPoolResync <= 0 {
		c.AgentPoolResync = DefaultAgentPoolResync
	}
	return c, nil
}

// NormalizeMaxRetries applies the maxRetries rule: nil means the default 3,
// negative means 0 (no retry), anything else stays.
func NormalizeMaxRetries(v *int) int {
	switch {
	case v == nil:
		return DefaultMaxRetries
	case *v < 0:
		return 0
	}
	return *v
}

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

var clouds = map[string]cloud.Configuration{
	"azurepubliccloud":       cloud.AzurePublic,
	"azurecloud":             cloud.AzurePublic,
	"azurechinacloud":        cloud.AzureChina,
	"azureusgovernmentcloud": cloud.AzureGovernment,
	"azureusgovernment":      cloud.AzureGovernment,
}

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
