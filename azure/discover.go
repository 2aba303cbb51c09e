package azure

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/backends"
)

// discover lists the managed load balancers and records which nodes have
// entries in which pools, when a node's membership is unknown or a resync is
// due. A resync also makes every node's work pending again. When listing
// fails, every node waiting for it gets a Warning event.
func (m *Manager) discover(ctx context.Context, ev *tickEvents) error {
	now := m.clock.Now()
	m.mu.Lock()
	resync := !now.Before(m.nextResync)
	need := resync || m.discoverErr != nil
	idents := make([]backends.Node, 0, len(m.nodes))
	versions := make(map[types.UID]uint64, len(m.nodes))
	for uid, n := range m.nodes {
		if n.gone != nil {
			continue
		}
		idents = append(idents, n.ident)
		versions[uid] = n.identV
		if !n.known {
			need = true
		}
	}
	m.mu.Unlock()
	if !need {
		return nil
	}
	pools, err := m.listPools(ctx)
	if err == nil {
		ix := backends.NewIndex(idents)
		members := map[string]map[string]bool{}
		for _, p := range pools {
			if members[p.key], err = ix.Members(ctx, p.pool, m.nics); err != nil {
				break
			}
		}
		if err == nil {
			present := m.recordMembership(pools, members, versions, resync, now, ev)
			m.dropVanishedRecords(ctx, present)
			return nil
		}
	}
	if ctx.Err() != nil {
		return err
	}
	if notFound(err) == codeResourceGroupNotFound {
		m.noteUnknown(ctx, fmt.Sprintf("resource group %s (--azure-resource-group) does not exist", m.cfg.ResourceGroup))
	}
	m.mu.Lock()
	m.discoverErr = err
	var events []pendingEvent
	for _, n := range m.nodes {
		if !n.known {
			events = append(events, pendingEvent{n, listFailedEvent(m.cfg.ResourceGroup, armclient.Summary(err), now.Add(m.cfg.RetryInterval))})
		}
	}
	m.mu.Unlock()
	m.emit(ev, events)
	return err
}

type listedPool struct {
	key, lb, name string
	pool          *armnetwork.BackendAddressPool
}

func poolKey(lb, pool string) string { return strings.ToLower(lb) + "/" + strings.ToLower(pool) }

// listPools returns every backend pool of the managed load balancers, except
// pools that serve only outbound rules.
func (m *Manager) listPools(ctx context.Context) ([]listedPool, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	var lbs []*armnetwork.LoadBalancer
	if len(m.cfg.LoadBalancers) == 0 {
		var err error
		if lbs, err = m.client.ListLoadBalancers(ctx, m.cfg.ResourceGroup); err != nil {
			return nil, fmt.Errorf("listing load balancers in %s: %w", m.cfg.ResourceGroup, err)
		}
		m.noteUnknown(ctx, "")
	} else {
		var missing []string
		for _, name := range m.cfg.LoadBalancers {
			lb, err := m.client.GetLoadBalancer(ctx, m.cfg.ResourceGroup, name)
			if code := notFound(err); code == codeResourceGroupNotFound {
				return nil, fmt.Errorf("getting load balancer %s: %w", name, err)
			} else if code != "" {
				missing = append(missing, name)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("getting load balancer %s: %w", name, err)
			}
			lbs = append(lbs, lb)
		}
		m.noteUnknown(ctx, missingLoadBalancers(m.cfg.ResourceGroup, missing))
	}
	var out []listedPool
	for _, lb := range lbs {
		if lb == nil || lb.Name == nil || lb.Properties == nil {
			continue
		}
		for _, p := range lb.Properties.BackendAddressPools {
			if p == nil || p.Name == nil || backends.OutboundOnly(p) {
				continue
			}
			out = append(out, listedPool{key: poolKey(*lb.Name, *p.Name), lb: *lb.Name, name: *p.Name, pool: p})
		}
	}
	return out, nil
}

// recordMembership stores what discovery found and returns the pools listed.
func (m *Manager) recordMembership(pools []listedPool, members map[string]map[string]bool, versions map[types.UID]uint64, resync bool, now time.Time, ev *tickEvents) map[string]bool {
	var events []pendingEvent
	m.mu.Lock()
	m.discoverErr = nil
	m.discovered = true
	if resync {
		m.nextResync = now.Add(m.cfg.ResyncInterval)
	}
	present := map[string]bool{}
	for _, p := range pools {
		present[p.key] = true
		if _, ok := m.pools[p.key]; !ok {
			m.pools[p.key] = &poolState{key: p.key, lb: p.lb, name: p.name}
		}
	}
	for k := range m.pools {
		if !present[k] {
			delete(m.pools, k)
		}
	}
	for uid, n := range m.nodes {
		if n.gone != nil {
			continue
		}
		v, seen := versions[uid]
		if !seen || v != n.identV {
			// Changed during discovery: its pools' fresh Gets tell.
			if !n.known {
				m.assumeMember(n)
			}
			continue
		}
		for k := range n.pools {
			if !present[k] || !members[k][string(uid)] {
				delete(n.pools, k)
			}
		}
		for k, nodes := range members {
			if !nodes[string(uid)] {
				continue
			}
			n.member = true
			w, ok := n.pools[k]
			switch {
			case !ok:
				n.pools[k] = &work{pending: true}
			case resync && !w.pending:
				w.again()
			}
		}
		if resync && n.failed != nil {
			n.failed = nil
		}
		n.known = true
		events = append(events, m.updateConfirmed(n)...)
	}
	m.mu.Unlock()
	m.emit(ev, events)
	return present
}
