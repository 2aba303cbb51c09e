package agentpools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/containerservice/armcontainerservice/v6"
	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/upgrade"
)

// APIVersion is the api-version of Microsoft.ContainerService the agent
// pools are read with: the first stable one whose AgentPoolUpgradeSettings
// has both maxUnavailable and undrainableNodeBehavior (2025-03-01 has only
// the latter). armcontainerservice v6, the newest major version served to
// this module, speaks 2025-02-01, which has neither: the SDK's models decode
// the other three settings, and decodeExtra the two it lacks.
const APIVersion = "2025-04-01"

// Defaults.
const (
	DefaultInterval = config.DefaultAgentPoolResync
	DefaultTimeout  = 2 * time.Minute
)

// ErrNotRead is AgentPools' error before the first read has ended: the
// budgets keep what they last said until then.
var ErrNotRead = upgrade.ErrNotRead

// Settings configure New.
type Settings struct {
	Cluster    config.ManagedCluster
	Credential azcore.TokenCredential
	// Cloud says where ARM is (its ResourceManager service must be set for a
	// non-public cloud or an emulator).
	Cloud cloud.Configuration
	// InsecureAllowHTTP allows the bearer token over plain HTTP (emulators).
	InsecureAllowHTTP bool
	// Interval between reads (DefaultInterval when zero).
	Interval time.Duration
	// Timeout bounds one read, with the SDK's retries (DefaultTimeout when
	// zero).
	Timeout time.Duration
	// Retry overrides the SDK's retry options (tests).
	Retry policy.RetryOptions
	// Transport replaces the HTTP client (tests).
	Transport policy.Transporter
	// Log is where read failures go (ctrl.Log's "aks-agent-pools" when unset).
	Log logr.Logger
}

// Poller is an upgrade.Source that lists the cluster's agent pools
// periodically. It is a manager.Runnable that runs on every replica.
type Poller struct {
	client            *armcontainerservice.AgentPoolsClient
	cluster           config.ManagedCluster
	interval, timeout time.Duration
	log               logr.Logger
	events            chan event.GenericEvent

	mu    sync.Mutex
	pools map[string]upgrade.Settings // the last good read; nil before it
	err   error                       // the last read's failure, or ErrNotRead
}

var _ upgrade.Source = (*Poller)(nil)

// New returns a Poller of s.Cluster; Start it (or add it to a manager).
func New(s Settings) (*Poller, error) {
	if s.Cluster.SubscriptionID == "" || s.Cluster.ResourceGroup == "" || s.Cluster.Name == "" {
		return nil, errors.New("agentpools: the managed cluster's subscription, resource group and name are required")
	}
	if s.Credential == nil {
		return nil, errors.New("agentpools: credential is required")
	}
	client, err := armcontainerservice.NewAgentPoolsClient(s.Cluster.SubscriptionID, s.Credential, &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			// ARM clients set this as the api-version query parameter of
			// every request (azcore's apiVersionPolicy), replacing the SDK's.
			APIVersion:                      APIVersion,
			Cloud:                           s.Cloud,
			Retry:                           s.Retry,
			InsecureAllowCredentialWithHTTP: s.InsecureAllowHTTP,
			Transport:                       s.Transport,
			Telemetry:                       policy.TelemetryOptions{ApplicationID: "nodeguard"},
		},
		DisableRPRegistration: true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the agent pools client: %w", err)
	}
	p := &Poller{client: client, cluster: s.Cluster, interval: s.Interval, timeout: s.Timeout, log: s.Log,
		events: make(chan event.GenericEvent, 1), err: ErrNotRead}
	if p.interval <= 0 {
		p.interval = DefaultInterval
	}
	if p.timeout <= 0 {
		p.timeout = DefaultTimeout
	}
	if p.log.GetSink() == nil {
		p.log = ctrl.Log.WithName("aks-agent-pools")
	}
	return p, nil
}

// FromConfig returns the Poller of cfg's --aks-managed-cluster with a
// credential of cfg's, or nil when none is configured.
func FromConfig(cfg *config.Config) (*Poller, error) {
	if cfg == nil || cfg.ManagedCluster == nil {
		return nil, nil
	}
	cred, err := cfg.NewCredential(azcore.ClientOptions{})
	if err != nil {
		return nil, fmt.Errorf("azure credential (%s): %w", cfg.Credential.Kind, err)
	}
	return New(Settings{Cluster: *cfg.ManagedCluster, Credential: cred, Cloud: cfg.Cloud, InsecureAllowHTTP: cfg.InsecureAllowHTTP,
		Interval: cfg.AgentPoolResync, Timeout: cfg.RequestTimeout})
}

// AgentPools implements upgrade.Source: the settings of the last good read
// by pool name, and the last read's failure.
func (p *Poller) AgentPools() (map[string]upgrade.Settings, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.pools), p.err
}

// Events receives one event (an empty NodeDisruptionBudget) after a read that
// changed the settings, or that started or stopped failing; a consumer that
// lags misses none, as events coalesce.
func (p *Poller) Events() <-chan event.GenericEvent { return p.events }

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica reads, as its budget webhook judges with the settings too.
func (p *Poller) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable: it reads at once, then every Interval,
// until ctx ends.
func (p *Poller) Start(ctx context.Context) error {
	p.log.Info("Reading the AKS agent pools' upgrade settings", "managedCluster", p.cluster.ID(), "interval", p.interval, "apiVersion", APIVersion)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		_ = p.Read(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Read lists the agent pools once and records the outcome.
func (p *Poller) Read(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pools, err := p.list(ctx)
	if errors.Is(err, context.Canceled) {
		return err // stopping: neither a failure nor a change
	}
	p.mu.Lock()
	wasFailing, first := p.err != nil, errors.Is(p.err, ErrNotRead)
	changed := first || wasFailing != (err != nil)
	if err == nil {
		changed = changed || !maps.Equal(p.pools, pools)
		p.pools = pools
	}
	p.err = err
	p.mu.Unlock()
	if err != nil {
		reads.WithLabelValues("error").Inc()
		// azcore's error spans many lines and holds the whole response.
		p.log.Error(errors.New(armclient.Summary(err)), "Reading the AKS agent pools failed: budgets keep the settings last read", "managedCluster", p.cluster.ID())
	} else {
		reads.WithLabelValues("success").Inc()
		poolsRead.Set(float64(len(pools)))
		if wasFailing && !first {
			p.log.Info("Read the AKS agent pools again", "managedCluster", p.cluster.ID(), "pools", len(pools))
		}
	}
	if changed {
		select {
		case p.events <- event.GenericEvent{Object: &ngv1alpha1.NodeDisruptionBudget{}}:
		default: // one is pending: it says the same
		}
	}
	return err
}

// list reads every page of the cluster's agent pools.
func (p *Poller) list(ctx context.Context) (map[string]upgrade.Settings, error) {
	pools := map[string]upgrade.Settings{}
	pager := p.client.NewListPager(p.cluster.ResourceGroup, p.cluster.Name, nil)
	for pager.More() {
		var raw *http.Response
		page, err := pager.NextPage(runtime.WithCaptureResponse(ctx, &raw))
		if err != nil {
			return nil, err
		}
		extra, err := decodeExtra(raw)
		if err != nil {
			return nil, err
		}
		for _, ap := range page.Value {
			if ap == nil || ap.Name == nil {
				continue
			}
			s := upgrade.Settings{Pool: *ap.Name}
			if ap.Properties != nil && ap.Properties.UpgradeSettings != nil {
				u := ap.Properties.UpgradeSettings
				s.MaxSurge = deref(u.MaxSurge)
				s.DrainTimeout = time.Duration(deref(u.DrainTimeoutInMinutes)) * time.Minute
				s.NodeSoak = time.Duration(deref(u.NodeSoakDurationInMinutes)) * time.Minute
			}
			e := extra[*ap.Name]
			s.MaxUnavailable, s.UndrainableNodeBehavior = e.MaxUnavailable, e.UndrainableNodeBehavior
			pools[s.Pool] = s
		}
	}
	return pools, nil
}

// extraSettings are the upgrade settings armcontainerservice v6's models
// lack (APIVersion).
type extraSettings struct {
	MaxUnavailable          string `json:"maxUnavailable"`
	UndrainableNodeBehavior string `json:"undrainableNodeBehavior"`
}

// decodeExtra reads them from a page's body, by pool name: the SDK has read
// the body, and runtime.Payload returns its buffered copy.
func decodeExtra(resp *http.Response) (map[string]extraSettings, error) {
	if resp == nil {
		return nil, errors.New("agentpools: no response captured")
	}
	body, err := runtime.Payload(resp)
	if err != nil {
		return nil, fmt.Errorf("re-reading the agent pools' response: %w", err)
	}
	var page struct {
		Value []struct {
			Name       string `json:"name"`
			Properties struct {
				UpgradeSettings extraSettings `json:"upgradeSettings"`
			} `json:"properties"`
		} `json:"value"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("decoding the agent pools' upgrade settings: %w", err)
	}
	extra := make(map[string]extraSettings, len(page.Value))
	for _, v := range page.Value {
		extra[v.Name] = v.Properties.UpgradeSettings
	}
	return extra, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
