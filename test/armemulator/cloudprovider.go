// CloudProvider: the other writer of the pools on AKS.

package armemulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// DefaultLBCacheTTL is cloud-provider-azure's load-balancer cache lifetime
// (loadBalancerCacheTTLDefaultInSeconds).
const DefaultLBCacheTTL = 120 * time.Second

// CloudProvider plays cloud-provider-azure's backend-pool reconcile against an
// emulator, over HTTP as its clients do (pkg/provider
// azure_loadbalancer_backendpool.go, backendPoolTypeNodeIP.EnsureHostsInPool,
// and azure_loadbalancer_repo.go):
//
//   - a reconcile reads the load balancers once at its start (Read: a List of
//     the resource group), then edits each IP-based pool as it read it, adding
//     the IPs of nodes it lacks (new entries carry no admin state: None) and
//     removing entries whose IP is no node's, and PUTs the whole pool WITHOUT
//     If-Match (its backend-pool client has no ETag policy) when membership
//     changed. An admin state set between the read and the PUT is put back;
//   - its whole-load-balancer writes (UpdateLoadBalancer) take the load
//     balancer from a cache (CacheTTL, 120 s), carry If-Match, and drop the
//     cache on 412, so the next one reads afresh.
type CloudProvider struct {
	BaseURL, Subscription, ResourceGroup string
	// Client defaults to http.DefaultClient.
	Client *http.Client
	// CacheTTL defaults to DefaultLBCacheTTL.
	CacheTTL time.Duration
	// Unpolled leaves its asynchronous operations to ARM instead of polling
	// them, so that each keeps its load balancer busy for the emulator's
	// Options.UnpolledOperationLifetime (LongOperation: as a long
	// cloud-provider-azure operation does).
	Unpolled bool

	mu    sync.Mutex
	cache map[string]cachedLB
	stats CloudProviderStats
}

type cachedLB struct {
	lb *armnetwork.LoadBalancer
	at time.Time
}

// CloudProviderStats counts the actor's calls and their outcomes.
type CloudProviderStats struct {
	Lists, LBGets, PoolPuts, LBPuts int
	// LBPut412 counts whole-LB PUTs refused for a stale ETag (each refreshes
	// the cache and is retried by a later reconcile).
	LBPut412 int
}

// NewCloudProvider returns the actor for an emulator.
func NewCloudProvider(s *Server) *CloudProvider {
	return &CloudProvider{BaseURL: s.URL(), Subscription: s.seed.Subscription, ResourceGroup: s.seed.ResourceGroup}
}

// Stats returns the counts so far.
func (c *CloudProvider) Stats() CloudProviderStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Snapshot is the load balancers as one reconcile read them at its start.
type Snapshot struct {
	c   *CloudProvider
	lbs map[string]*armnetwork.LoadBalancer // by lower-case name
}

// Read starts a reconcile: one List of the resource group's load balancers.
func (c *CloudProvider) Read(ctx context.Context) (*Snapshot, error) {
	var res armnetwork.LoadBalancerListResult
	if err := c.do(ctx, http.MethodGet, c.networkPath("loadBalancers"), "", nil, &res); err != nil {
		return nil, err
	}
	c.count(func(s *CloudProviderStats) { s.Lists++ })
	snap := &Snapshot{c: c, lbs: map[string]*armnetwork.LoadBalancer{}}
	for _, lb := range res.Value {
		snap.lbs[strings.ToLower(deref(lb.Name))] = lb
	}
	return snap, nil
}

// EnsureHostsInPool makes the pool, as this snapshot read it, hold exactly
// the nodes' IPs of its family (pools named *-IPv6 take IPv6), and PUTs it
// without If-Match when that changed its membership. It returns the IPs it
// wrote (nil when it wrote nothing).
func (s *Snapshot) EnsureHostsInPool(ctx context.Context, lb, pool string, nodes []Node) ([]string, error) {
	p := s.pool(lb, pool)
	if p == nil || p.Properties == nil {
		return nil, fmt.Errorf("backend pool %s/%s not in the snapshot", lb, pool)
	}
	v6 := strings.HasSuffix(strings.ToLower(pool), "-ipv6")
	want := map[string]string{} // IP → node name
	var order []string
	for _, n := range nodes {
		for _, ip := range n.IPs {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is6() == v6 {
				want[ip] = n.Name
				order = append(order, ip)
			}
		}
	}
	changed := false
	kept := p.Properties.LoadBalancerBackendAddresses[:0]
	have := map[string]bool{}
	for _, e := range p.Properties.LoadBalancerBackendAddresses {
		ip := ""
		if e.Properties != nil {
			ip = deref(e.Properties.IPAddress)
		}
		if _, ok := want[ip]; !ok {
			changed = true
			continue
		}
		have[ip] = true
		kept = append(kept, e)
	}
	for _, ip := range order {
		if !have[ip] {
			changed = true
			kept = append(kept, &armnetwork.LoadBalancerBackendAddress{Name: ptr(want[ip]),
				Properties: &armnetwork.LoadBalancerBackendAddressPropertiesFormat{IPAddress: ptr(ip)}})
		}
	}
	p.Properties.LoadBalancerBackendAddresses = kept
	if !changed {
		return nil, nil
	}
	if err := s.c.do(ctx, http.MethodPut, s.c.networkPath("loadBalancers", lb, "backendAddressPools", pool), "", p, nil); err != nil {
		return nil, fmt.Errorf("PUT backend pool %s/%s: %w", lb, pool, err)
	}
	s.c.count(func(st *CloudProviderStats) { st.PoolPuts++ })
	s.c.drop(lb)
	out := make([]string, 0, len(kept))
	for _, e := range kept {
		out = append(out, deref(e.Properties.IPAddress))
	}
	return out, nil
}

func (s *Snapshot) pool(lb, pool string) *armnetwork.BackendAddressPool {
	l := s.lbs[strings.ToLower(lb)]
	if l == nil || l.Properties == nil {
		return nil
	}
	for _, p := range l.Properties.BackendAddressPools {
		if strings.EqualFold(deref(p.Name), pool) {
			return p
		}
	}
	return nil
}

// UpdateLoadBalancer is a whole-load-balancer write (a Service's rules
// changed): the load balancer comes from the cache, or a GET when the cache
// has none younger than CacheTTL, and is PUT with If-Match. A 412 drops the
// cache and is returned, as CreateOrUpdateLB does.
func (c *CloudProvider) UpdateLoadBalancer(ctx context.Context, lb string) error {
	cached, err := c.cachedLB(ctx, lb)
	if err != nil {
		return err
	}
	err = c.do(ctx, http.MethodPut, c.networkPath("loadBalancers", lb), deref(cached.Etag), cached, nil)
	c.drop(lb)
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusPreconditionFailed {
		c.count(func(s *CloudProviderStats) { s.LBPut412++ })
		return err
	}
	if err == nil {
		c.count(func(s *CloudProviderStats) { s.LBPuts++ })
	}
	return err
}

func (c *CloudProvider) cachedLB(ctx context.Context, lb string) (*armnetwork.LoadBalancer, error) {
	ttl := c.CacheTTL
	if ttl == 0 {
		ttl = DefaultLBCacheTTL
	}
	c.mu.Lock()
	e, ok := c.cache[strings.ToLower(lb)]
	c.mu.Unlock()
	if ok && time.Since(e.at) < ttl {
		return e.lb, nil
	}
	var got armnetwork.LoadBalancer
	if err := c.do(ctx, http.MethodGet, c.networkPath("loadBalancers", lb), "", nil, &got); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.LBGets++
	if c.cache == nil {
		c.cache = map[string]cachedLB{}
	}
	c.cache[strings.ToLower(lb)] = cachedLB{lb: &got, at: time.Now()}
	return &got, nil
}

// drop invalidates the cached load balancer (after any write, as the real
// repo does).
func (c *CloudProvider) drop(lb string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cache, strings.ToLower(lb))
}

func (c *CloudProvider) count(f func(*CloudProviderStats)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.stats)
}

func (c *CloudProvider) networkPath(parts ...string) string {
	return fmt.Sprintf("%s/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/%s?api-version=%s",
		c.BaseURL, c.Subscription, c.ResourceGroup, strings.Join(parts, "/"), APIVersion)
}

// StatusError is a non-2xx answer to the actor.
type StatusError struct {
	Status int
	Body   string
}

func (e *StatusError) Error() string { return fmt.Sprintf("status %d: %s", e.Status, e.Body) }

// do sends one request; a PUT answered as an asynchronous operation is
// polled until it ends. A 429 is sent again after its Retry-After, as the
// Azure SDK's retry policy does (cloud-provider-azure's clients keep it), for
// as long as ctx lasts.
func (c *CloudProvider) do(ctx context.Context, method, url, ifMatch string, body, out any) error {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		payload = b
	}
	for {
		resp, data, err := c.send(ctx, method, url, ifMatch, payload)
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-ctx.Done():
				return &StatusError{Status: resp.StatusCode, Body: string(data)}
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			}
			continue
		}
		if resp.StatusCode >= 300 {
			return &StatusError{Status: resp.StatusCode, Body: string(data)}
		}
		if op := resp.Header.Get("Azure-AsyncOperation"); op != "" && !c.Unpolled {
			return c.poll(ctx, op)
		}
		if out != nil {
			return json.Unmarshal(data, out)
		}
		return nil
	}
}

// send makes one HTTP request and reads its answer.
func (c *CloudProvider) send(ctx context.Context, method, url, ifMatch string, payload []byte) (*http.Response, []byte, error) {
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp, data, err
}

// poll waits for an asynchronous operation to end.
func (c *CloudProvider) poll(ctx context.Context, url string) error {
	for {
		var st struct{ Status string }
		if err := c.do(ctx, http.MethodGet, url, "", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "Succeeded":
			return nil
		case "InProgress", "":
		default:
			return fmt.Errorf("operation %s", st.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond): // the operation's own poll interval
		}
	}
}
