package armclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/utils/clock"
)

// Client is what the admin-state manager needs from ARM.
type Client interface {
	// ListLoadBalancers lists every load balancer in a resource group, with
	// their backend pools. It reads what discovery and verification need
	// (lean.go): each pool's entries (name, IP, admin state, NIC IP
	// configuration), its NIC IP configurations and its rules' IDs; write a
	// pool from GetPool, never from this.
	ListLoadBalancers(ctx context.Context, resourceGroup string) ([]*armnetwork.LoadBalancer, error)
	// GetLoadBalancer gets one load balancer with its backend pools, read as
	// ListLoadBalancers reads them.
	GetLoadBalancer(ctx context.Context, resourceGroup, name string) (*armnetwork.LoadBalancer, error)
	// GetPool gets one backend pool, with its ETag.
	GetPool(ctx context.Context, resourceGroup, loadBalancer, pool string) (*armnetwork.BackendAddressPool, error)
	// UpdatePool writes a backend pool with If-Match: pool.Etag and waits
	// until the write has completed.
	UpdatePool(ctx context.Context, resourceGroup, loadBalancer string, pool *armnetwork.BackendAddressPool) (*armnetwork.BackendAddressPool, error)
	// GetInterface gets a NIC by its full resource ID.
	GetInterface(ctx context.Context, id string) (*armnetwork.Interface, error)
	// VMExists reports whether a VM (standalone or VMSS instance, by its
	// resource ID, see VMResourceID) exists.
	VMExists(ctx context.Context, id string) (bool, error)
}

// Settings configure New.
type Settings struct {
	SubscriptionID string
	Credential     azcore.TokenCredential
	// Cloud says where ARM is (its ResourceManager service must be set for a
	// non-public cloud or an emulator).
	Cloud cloud.Configuration
	// InsecureAllowHTTP allows a bearer token over plain HTTP (emulators).
	InsecureAllowHTTP bool
	// Retry overrides the SDK's retry options (zero: its defaults, 3 retries
	// from 800 ms for 408/429/500/502/503/504).
	Retry policy.RetryOptions
	// PollFrequency is how often a long-running write is polled when ARM
	// sends no Retry-After (default 2 s; at least 1 s outside tests).
	PollFrequency time.Duration
	// Clock drives the throttling gate (a real clock when nil).
	Clock clock.PassiveClock
	// Transport replaces the HTTP client (tests).
	Transport policy.Transporter
}

// DefaultPollFrequency is Settings.PollFrequency's default.
const DefaultPollFrequency = 2 * time.Second

type sdkClient struct {
	opts          *arm.ClientOptions
	cred          azcore.TokenCredential
	subscription  string
	pollFrequency time.Duration

	pools *armnetwork.LoadBalancerBackendAddressPoolsClient
	// raw carries the GETs of VMs and of load balancers (vms.go, lean.go)
	// through the SDK pipeline: credential, retries, throttling gate;
	// endpoint is ARM's.
	raw      *arm.Client
	endpoint string

	mu   sync.Mutex
	nics map[string]*armnetwork.InterfacesClient // by lower(subscription)
}

// New returns a Client for one subscription.
func New(s Settings) (Client, error) {
	if s.SubscriptionID == "" {
		return nil, errors.New("armclient: subscription ID is required")
	}
	if s.Credential == nil {
		return nil, errors.New("armclient: credential is required")
	}
	opts := &arm.ClientOptions{
		ClientOptions: policy.ClientOptions{
			Cloud:                           s.Cloud,
			Retry:                           s.Retry,
			PerRetryPolicies:                []policy.Policy{NewThrottlingPolicy(s.Clock)},
			InsecureAllowCredentialWithHTTP: s.InsecureAllowHTTP,
			Transport:                       s.Transport,
			Telemetry:                       policy.TelemetryOptions{ApplicationID: "nodeguard"},
		},
		DisableRPRegistration: true,
	}
	c := &sdkClient{opts: opts, cred: s.Credential, subscription: s.SubscriptionID, pollFrequency: s.PollFrequency, nics: map[string]*armnetwork.InterfacesClient{}}
	if c.pollFrequency <= 0 {
		c.pollFrequency = DefaultPollFrequency
	}
	var err error
	if c.pools, err = armnetwork.NewLoadBalancerBackendAddressPoolsClient(s.SubscriptionID, s.Credential, opts); err != nil {
		return nil, fmt.Errorf("creating backend pools client: %w", err)
	}
	if c.raw, err = arm.NewClient("nodeguard/arm", "v0.1.0", s.Credential, opts); err != nil {
		return nil, fmt.Errorf("creating ARM client: %w", err)
	}
	c.endpoint = c.raw.Endpoint()
	return c, nil
}

// get sends a GET of an ARM URL (with its api-version) through the pipeline.
func (c *sdkClient) get(ctx context.Context, rawURL string) (*http.Response, error) {
	req, err := runtime.NewRequest(ctx, http.MethodGet, rawURL)
	if err != nil {
		return nil, err
	}
	req.Raw().Header["Accept"] = []string{"application/json"}
	return c.raw.Pipeline().Do(req)
}

func (c *sdkClient) GetPool(ctx context.Context, resourceGroup, loadBalancer, pool string) (*armnetwork.BackendAddressPool, error) {
	resp, err := c.pools.Get(ctx, resourceGroup, loadBalancer, pool, nil)
	if err != nil {
		return nil, err
	}
	return &resp.BackendAddressPool, nil
}

func (c *sdkClient) UpdatePool(ctx context.Context, resourceGroup, loadBalancer string, pool *armnetwork.BackendAddressPool) (*armnetwork.BackendAddressPool, error) {
	if pool.Name == nil {
		return nil, errors.New("backend pool has no name")
	}
	putCtx := ctx
	if pool.Etag != nil && *pool.Etag != "" {
		// armnetwork has no If-Match option: send the header through the
		// context, the PUT's alone. The polls and the final GET come after
		// the PUT moved the ETag; on them a stale If-Match asks for a 412.
		putCtx = policy.WithHTTPHeader(ctx, http.Header{"If-Match": []string{*pool.Etag}})
	}
	poller, err := c.pools.BeginCreateOrUpdate(putCtx, resourceGroup, loadBalancer, *pool.Name, *pool, nil)
	if err != nil {
		return nil, err
	}
	resp, err := poller.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: c.pollFrequency})
	if err != nil {
		return nil, err
	}
	return &resp.BackendAddressPool, nil
}

func (c *sdkClient) GetInterface(ctx context.Context, id string) (*armnetwork.Interface, error) {
	rid, err := arm.ParseResourceID(id)
	if err != nil {
		return nil, fmt.Errorf("parsing NIC ID %q: %w", id, err)
	}
	if !strings.EqualFold(rid.ResourceType.String(), "Microsoft.Network/networkInterfaces") {
		return nil, fmt.Errorf("%q is not a network interface ID", id)
	}
	nics, err := c.interfaces(rid.SubscriptionID)
	if err != nil {
		return nil, err
	}
	resp, err := nics.Get(ctx, rid.ResourceGroupName, rid.Name, nil)
	if err != nil {
		return nil, err
	}
	return &resp.Interface, nil
}

func (c *sdkClient) interfaces(subscription string) (*armnetwork.InterfacesClient, error) {
	if subscription == "" {
		subscription = c.subscription
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := strings.ToLower(subscription)
	if nc, ok := c.nics[k]; ok {
		return nc, nil
	}
	nc, err := armnetwork.NewInterfacesClient(subscription, c.cred, c.opts)
	if err != nil {
		return nil, fmt.Errorf("creating network interfaces client: %w", err)
	}
	c.nics[k] = nc
	return nc, nil
}

// Summary is a one-line description of an ARM error, for events and logs
// (azcore's own message spans many lines and includes the whole response).
func Summary(err error) string {
	var te *ThrottleError
	if errors.As(err, &te) {
		return te.Error()
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		msg := fmt.Sprintf("ARM responded %d", re.StatusCode)
		if re.ErrorCode != "" {
			msg += " " + re.ErrorCode
		}
		if re.RawResponse != nil && re.RawResponse.Request != nil {
			msg += " to " + re.RawResponse.Request.Method + " " + re.RawResponse.Request.URL.Path
		}
		return msg
	}
	return err.Error()
}
