// Package config reads nodeguard's Azure configuration and resolves it into
// a Config (Options.Load, this file): azure.json, the file
// cloud-provider-azure reads on AKS nodes (azurejson.go), overridden by
// environment variables and then flags (options.go); the cloud's endpoints
// (cloud.go); the azidentity credential, chosen in cloud-provider-azure's
// order (credential.go); and the AKS managed cluster whose agent pools'
// upgrade settings are read (aks.go).
package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
)

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
	aks, err := o.loadAKS()
	if err != nil {
		return nil, err
	}
	f, found, err := readFile(o.ConfigFile)
	if err != nil {
		return nil, err
	}
	src := sources{file: f, getenv: o.Getenv}
	if src.getenv == nil {
		src.getenv = os.Getenv
	}
	subscription := src.pick(o.SubscriptionID, EnvSubscriptionID, f.SubscriptionID)
	endpoint := src.pick(o.ARMEndpoint, EnvARMEndpoint, f.ResourceManagerEndpoint)
	if !found && subscription == "" && endpoint == "" {
		if aks != nil {
			return nil, errAKSNeedsAzure
		}
		return nil, ErrNotConfigured
	}
	c := o.settings(aks)
	c.SubscriptionID = subscription
	c.TenantID = src.pick(o.TenantID, EnvTenantID, f.TenantID)
	if c.RestoreHold < 0 {
		return nil, &FieldError{Field: "--azure-admin-state-restore-hold", Reason: fmt.Sprintf("%s is negative: give 0 to stop watching restored entries at once", c.RestoreHold)}
	}
	if err := c.resolveScope(o, src); err != nil {
		return nil, err
	}
	if c.MaxRetries, err = src.maxRetries(o.MaxRetries); err != nil {
		return nil, err
	}
	if err := c.resolveCloud(src.pick(o.Cloud, EnvCloud, f.Cloud), endpoint, o.ARMAudience, src.pick(o.AuthorityHost, EnvAuthorityHost, "")); err != nil {
		return nil, err
	}
	if c.Credential, err = chooseCredential(o, f, src.getenv, c); err != nil {
		return nil, err
	}
	c.defaultUnset()
	return c, nil
}

// sources are where a setting is read: a flag wins over its environment
// variable, which wins over azure.json.
type sources struct {
	file   File
	getenv func(string) string
}

// pick is the first of a flag's value, the environment variable's and the
// file's that is set.
func (s sources) pick(flagV, envName, fileV string) string {
	if flagV != "" {
		return flagV
	}
	if v := s.getenv(envName); v != "" {
		return v
	}
	return fileV
}

// maxRetries is loadBalancerBackendPoolUpdateMaxRetries from the file, the
// environment or the flag (NormalizeMaxRetries).
func (s sources) maxRetries(flagV OptionalInt) (int, error) {
	v := s.file.LoadBalancerBackendPoolUpdateMaxRetries
	if env := s.getenv(EnvAdminStateRetries); env != "" {
		n, err := strconv.Atoi(env)
		if err != nil {
			return 0, &FieldError{Field: "loadBalancerBackendPoolUpdateMaxRetries ($" + EnvAdminStateRetries + ")", Reason: fmt.Sprintf("%q is not an integer", env)}
		}
		v = &n
	}
	if flagV.V != nil {
		v = flagV.V
	}
	return NormalizeMaxRetries(v), nil
}

// settings are the Config of what only flags set.
func (o Options) settings(aks *ManagedCluster) *Config {
	return &Config{
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
}

// resolveScope sets where the load balancers are, and which of them
// nodeguard manages: their resource group is the load balancers' own when
// one is given, else the cluster's.
func (c *Config) resolveScope(o Options, src sources) error {
	c.ResourceGroup = src.pick(o.ResourceGroup, EnvResourceGroup, src.file.ResourceGroup)
	if lbrg := src.pick(o.LoadBalancerResourceGroup, EnvLoadBalancerRGroup, src.file.LoadBalancerResourceGroup); lbrg != "" {
		c.ResourceGroup = lbrg
	}
	if c.SubscriptionID == "" {
		return &FieldError{Field: "subscriptionId (--azure-subscription-id, $" + EnvSubscriptionID + ")", Reason: "is required"}
	}
	if c.ResourceGroup == "" {
		return &FieldError{Field: "resourceGroup (--azure-resource-group, $" + EnvResourceGroup + ")", Reason: "is required: it holds the cluster's load balancers"}
	}
	lbs := src.pick(o.LoadBalancers, EnvLoadBalancers, strings.Join(src.file.AdminStateLoadBalancers, ","))
	for _, n := range strings.Split(lbs, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.LoadBalancers = append(c.LoadBalancers, n)
		}
	}
	return nil
}

// defaultUnset puts the defaults in place of the settings that cannot work
// as given (a zero interval, no worker), and turns a negative grace or
// verify interval off.
func (c *Config) defaultUnset() {
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
