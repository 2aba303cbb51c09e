package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/backends"
)

// minWake keeps the loop from spinning.
const minWake = 10 * time.Millisecond

// group is one backend pool's pending work, snapshotted for one attempt.
type group struct {
	pool *poolState
	// participants: nodes with pending work in the pool, with their
	// generation at snapshot time.
	participants map[types.UID]uint64
}

// snapshot is what every pool attempt of one tick reads.
type snapshot struct {
	index   *backends.Index
	desired map[string]AdminState // by node UID
	gens    map[types.UID]uint64
}

// result is the outcome of one pool attempt.
type result struct {
	err error
	// wrote: a CreateOrUpdate completed.
	wrote bool
	// matched: nodes with an entry in the fresh pool.
	matched map[string]bool
	// changed: nodes whose entries this attempt wrote.
	changed map[string]bool
	// entryless: members of the fresh pool (by backendIPConfigurations) with
	// no entry to carry an admin state.
	entryless map[string]bool
}

// tickEvents sends at most one event per node and reason in a tick.
type tickEvents struct {
	mu   sync.Mutex
	seen map[string]bool
}

// tick runs one round: discovery when needed, then one attempt for every
// eligible pool with pending work. It returns how long to sleep at most.
func (m *Manager) tick(ctx context.Context) time.Duration {
	log := ctrl.LoggerFrom(ctx)
	ev := &tickEvents{seen: map[string]bool{}}
	if err := m.discover(ctx, ev); err != nil && ctx.Err() == nil {
		log.Error(err, "Listing load balancers failed; retrying")
	}
	groups, snap := m.eligible()
	sem := make(chan struct{}, max(1, m.cfg.Workers))
	var wg sync.WaitGroup
	for _, lbGroups := range byLoadBalancer(groups) {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			// One writer per load balancer: ARM keeps one ETag per load
			// balancer, so its pools are written one after another, each
			// after a fresh Get. Load balancers proceed in parallel.
			for _, g := range lbGroups {
				if ctx.Err() != nil {
					return
				}
				res := m.processPool(ctx, g.pool, snap)
				m.apply(ctx, g, snap, res, ev)
			}
		}()
	}
	wg.Wait()
	return m.nextWake()
}

// byLoadBalancer splits the pools with work by load balancer, each load
// balancer's pools in name order.
func byLoadBalancer(groups []group) [][]group {
	index := map[string]int{}
	var out [][]group
	for _, g := range groups {
		lb := strings.ToLower(g.pool.lb)
		i, ok := index[lb]
		if !ok {
			i = len(out)
			index[lb] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], g)
	}
	for _, gs := range out {
		slices.SortFunc(gs, func(a, b group) int { return strings.Compare(a.pool.key, b.pool.key) })
	}
	return out
}

// discover lists the managed load balancers and records which nodes have
// entries in which pools, when a node's membership is unknown or a resync is
// due. A resync also makes every node's work pending again.
func (m *Manager) discover(ctx context.Context, ev *tickEvents) error {
	now := m.clock.Now()
	m.mu.Lock()
	resync := !now.Before(m.nextResync)
	need := resync || m.discoverErr != nil
	idents := make([]backends.Node, 0, len(m.nodes))
	versions := make(map[types.UID]uint64, len(m.nodes))
	for uid, n := range m.nodes {
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
			m.recordMembership(pools, members, versions, resync, now, ev)
			return nil
		}
	}
	m.mu.Lock()
	m.discoverErr = err
	m.mu.Unlock()
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
	} else {
		for _, name := range m.cfg.LoadBalancers {
			lb, err := m.client.GetLoadBalancer(ctx, m.cfg.ResourceGroup, name)
			var re *azcore.ResponseError
			if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
				ctrl.LoggerFrom(ctx).V(1).Info("Configured load balancer does not exist", "loadBalancer", name)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("getting load balancer %s: %w", name, err)
			}
			lbs = append(lbs, lb)
		}
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

func (m *Manager) recordMembership(pools []listedPool, members map[string]map[string]bool, versions map[types.UID]uint64, resync bool, now time.Time, ev *tickEvents) {
	var events []pendingEvent
	m.mu.Lock()
	m.discoverErr = nil
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
		v, seen := versions[uid]
		if !seen || v != n.identV {
			continue // changed during discovery: the next tick looks again
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
			w, ok := n.pools[k]
			switch {
			case !ok:
				n.pools[k] = &work{pending: true}
			case resync && !w.pending:
				*w = work{pending: true}
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
}

// eligible snapshots the pools with pending work that are not parked.
func (m *Manager) eligible() ([]group, snapshot) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := snapshot{desired: make(map[string]AdminState, len(m.nodes)), gens: make(map[types.UID]uint64, len(m.nodes))}
	idents := make([]backends.Node, 0, len(m.nodes))
	byPool := map[string]*group{}
	for uid, n := range m.nodes {
		idents = append(idents, n.ident)
		snap.desired[string(uid)] = n.desired
		snap.gens[uid] = n.gen
		if !n.known {
			continue
		}
		for k, w := range n.pools {
			if !w.pending {
				continue
			}
			p, ok := m.pools[k]
			if !ok {
				continue
			}
			g, ok := byPool[k]
			if !ok {
				g = &group{pool: &poolState{key: p.key, lb: p.lb, name: p.name}, participants: map[types.UID]uint64{}}
				byPool[k] = g
			}
			g.participants[uid] = n.gen
		}
	}
	snap.index = backends.NewIndex(idents)
	var groups []group
	for k, g := range byPool {
		if m.pools[k].notBefore.After(now) {
			// Parked: no call, no event, no retry count, for old and new work alike.
			parkedTicks.Inc()
			continue
		}
		groups = append(groups, *g)
	}
	return groups, snap
}

// processPool makes one attempt at a pool: lock, fresh Get, set AdminState
// on every entry whose node's desired state differs, and one CreateOrUpdate
// with If-Match when anything changed.
func (m *Manager) processPool(ctx context.Context, p *poolState, snap snapshot) result {
	res := result{matched: map[string]bool{}, changed: map[string]bool{}, entryless: map[string]bool{}}
	lock := m.poolLock(p.key)
	start := time.Now()
	lock.Lock()
	lockWait.WithLabelValues(lockBackendPool, callerAdminState).Observe(time.Since(start).Seconds())
	defer lock.Unlock()

	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	pool, err := m.client.GetPool(ctx, m.cfg.ResourceGroup, p.lb, p.name)
	if err != nil {
		res.err = fmt.Errorf("getting backend pool %s: %w", p.key, err)
		return res
	}
	keys, err := snap.index.Match(ctx, pool, m.nics)
	if err != nil {
		res.err = fmt.Errorf("matching nodes to backend pool %s: %w", p.key, err)
		return res
	}
	for i, k := range keys {
		if k == "" {
			continue
		}
		res.matched[k] = true
		e := pool.Properties.LoadBalancerBackendAddresses[i]
		want := snap.desired[k]
		if !differs(e.Properties.AdminState, want) {
			continue
		}
		s := armnetwork.LoadBalancerBackendAddressAdminState(want)
		e.Properties.AdminState = &s
		res.changed[k] = true
	}
	members, err := snap.index.Members(ctx, pool, m.nics)
	if err != nil {
		res.err = fmt.Errorf("matching nodes to backend pool %s: %w", p.key, err)
		return res
	}
	for k := range members {
		if !res.matched[k] {
			res.entryless[k] = true
		}
	}
	if len(res.changed) == 0 {
		return res
	}
	if _, err := m.client.UpdatePool(ctx, m.cfg.ResourceGroup, p.lb, pool); err != nil {
		res.err = fmt.Errorf("updating backend pool %s: %w", p.key, err)
		return res
	}
	res.wrote = true
	ctrl.LoggerFrom(ctx).V(1).Info("Updated backend pool admin state", "pool", p.key, "entries", len(res.changed))
	return res
}

// differs reports whether an entry's admin state must change to match want.
// None means "not forced": an entry someone set Up is left alone.
func differs(cur *armnetwork.LoadBalancerBackendAddressAdminState, want AdminState) bool {
	c := armnetwork.LoadBalancerBackendAddressAdminStateNone
	if cur != nil && *cur != "" {
		c = *cur
	}
	if want == AdminStateDown {
		return c != armnetwork.LoadBalancerBackendAddressAdminStateDown
	}
	return c == armnetwork.LoadBalancerBackendAddressAdminStateDown
}

type pendingEvent struct {
	node *nodeState
	ev   event
}

// apply records a pool attempt's outcome.
func (m *Manager) apply(ctx context.Context, g group, snap snapshot, res result, ev *tickEvents) {
	class, retryAfter := classTerminal, time.Time{}
	if res.err != nil {
		class, retryAfter = classify(ctx, res.err)
	}
	now := m.clock.Now()
	var events []pendingEvent
	m.mu.Lock()
	p := m.pools[g.pool.key]
	switch {
	case res.err == nil:
		events = m.applySuccess(g, snap, res)
	case class == classShutdown:
		// Abandoned because we are stopping: nothing to report.
	case class == classStale:
		delete(m.pools, g.pool.key)
		for _, n := range m.nodes {
			delete(n.pools, g.pool.key)
			events = append(events, m.updateConfirmed(n)...)
		}
	case class == classThrottled, class == classRetriable:
		at := now.Add(m.cfg.RetryInterval)
		if class == classThrottled && retryAfter.After(now) {
			at = retryAfter
		}
		if p != nil {
			p.notBefore = at
		}
		events = m.applyRetriable(g, res.err, at)
	default:
		poolUpdates.WithLabelValues(resultFailure).Inc()
		events = m.applyTerminal(g, res.err)
	}
	m.mu.Unlock()
	if res.err != nil && class != classShutdown && class != classStale {
		ctrl.LoggerFrom(ctx).V(1).Info("Backend pool update failed", "pool", g.pool.key, "error", armclient.Summary(res.err))
	}
	m.emit(ev, events)
}

// applySuccess confirms the pool for every node whose desired state is still
// the one applied. Call with m.mu held.
func (m *Manager) applySuccess(g group, snap snapshot, res result) []pendingEvent {
	if res.wrote {
		poolUpdates.WithLabelValues(resultSuccess).Inc()
	}
	if p := m.pools[g.pool.key]; p != nil {
		p.notBefore = time.Time{}
	}
	var events []pendingEvent
	for uid, n := range m.nodes {
		w := n.pools[g.pool.key]
		if w == nil {
			if res.matched[string(uid)] && n.known && m.pools[g.pool.key] != nil {
				// A member discovery had not seen yet: now confirmed.
				n.pools[g.pool.key] = &work{}
			}
			continue
		}
		if gen, ok := snap.gens[uid]; !ok || gen != n.gen {
			continue // desired state changed meanwhile: stays pending
		}
		if res.entryless[string(uid)] && n.desired == AdminStateDown {
			// Never confirm a Down that no write carried.
			w.pending, w.failed = false, true
			n.failed = &UpdateFailedError{Pool: g.pool.key, Err: ErrNoEntry}
			n.signal()
			entryless.Inc()
			events = append(events, pendingEvent{n, noEntryEvent(g.pool.key)})
			continue
		}
		*w = work{}
		if res.changed[string(uid)] {
			n.changed = true
		}
		if n.failed != nil && !n.anyFailed() {
			n.failed = nil
		}
		events = append(events, m.updateConfirmed(n)...)
	}
	return events
}

// applyRetriable spends one retry of every participant; those out of
// retries fail. Call with m.mu held.
func (m *Manager) applyRetriable(g group, err error, at time.Time) []pendingEvent {
	var events []pendingEvent
	exhausted := false
	msg := armclient.Summary(err)
	for uid, gen := range g.participants {
		n := m.nodes[uid]
		if n == nil || n.gen != gen {
			continue // forgotten or changed: dropped quietly
		}
		w := n.pools[g.pool.key]
		if w == nil || !w.pending {
			continue
		}
		if w.retries >= m.cfg.MaxRetries {
			exhausted = true
			w.pending, w.failed = false, true
			n.failed = &UpdateFailedError{Pool: g.pool.key, Retries: w.retries, Err: err}
			n.signal()
			events = append(events, pendingEvent{n, exhaustedEvent(g.pool.key, w.retries, msg, m.cfg.ResyncInterval)})
			continue
		}
		w.retries++
		events = append(events, pendingEvent{n, retryingEvent(g.pool.key, w.retries, m.cfg.MaxRetries, msg, at)})
	}
	if exhausted {
		poolUpdates.WithLabelValues(resultFailure).Inc()
	}
	return events
}

// applyTerminal fails every participant. Call with m.mu held.
func (m *Manager) applyTerminal(g group, err error) []pendingEvent {
	var events []pendingEvent
	msg := armclient.Summary(err)
	for uid, gen := range g.participants {
		n := m.nodes[uid]
		if n == nil || n.gen != gen {
			continue
		}
		w := n.pools[g.pool.key]
		if w == nil || !w.pending {
			continue
		}
		w.pending, w.failed = false, true
		n.failed = &UpdateFailedError{Pool: g.pool.key, Err: err}
		n.signal()
		events = append(events, pendingEvent{n, failedEvent(g.pool.key, msg)})
	}
	return events
}

func (n *nodeState) anyFailed() bool {
	for _, w := range n.pools {
		if w.failed {
			return true
		}
	}
	return false
}

// updateConfirmed marks a node confirmed once no pool has work left, and
// returns the confirmation event when nodeguard changed its entries. Call
// with m.mu held.
func (m *Manager) updateConfirmed(n *nodeState) []pendingEvent {
	if n.confirmed || !n.known {
		return nil
	}
	for _, w := range n.pools {
		if w.pending || w.failed {
			return nil
		}
	}
	n.confirmed = true
	n.failed = nil
	n.signal()
	confirmDuration.WithLabelValues(string(n.desired)).Observe(m.clock.Since(n.since).Seconds())
	if !n.changed {
		return nil
	}
	return []pendingEvent{{n, confirmedEvent(n.desired, len(n.pools))}}
}

// emit records events, one per node and reason per tick.
func (m *Manager) emit(ev *tickEvents, events []pendingEvent) {
	if m.recorder == nil {
		return
	}
	for _, e := range events {
		k := string(e.node.uid) + "/" + e.ev.reason
		ev.mu.Lock()
		dup := ev.seen[k]
		ev.seen[k] = true
		ev.mu.Unlock()
		if dup {
			continue
		}
		typ := corev1.EventTypeNormal
		if e.ev.warning {
			typ = corev1.EventTypeWarning
		}
		m.recorder.Eventf(regarding(e.node), nil, typ, e.ev.reason, eventAction, "%s", e.ev.note)
	}
}

// nextWake is how long the loop may sleep: until the next resync, the
// earliest parked pool, or the retry interval while work is pending.
func (m *Manager) nextWake() time.Duration {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.nextResync.Sub(now)
	if m.discoverErr != nil {
		d = min(d, m.cfg.RetryInterval)
	}
	for _, n := range m.nodes {
		if !n.known {
			d = min(d, m.cfg.RetryInterval)
			continue
		}
		for k, w := range n.pools {
			if !w.pending {
				continue
			}
			if p := m.pools[k]; p != nil && p.notBefore.After(now) {
				d = min(d, p.notBefore.Sub(now))
			} else {
				d = min(d, m.cfg.RetryInterval)
			}
		}
	}
	return max(d, minWake)
}
