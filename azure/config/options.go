package config

import (
	"flag"
	"strconv"
	"time"
)

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
