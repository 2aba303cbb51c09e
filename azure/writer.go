package azure

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

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

// snapshot is what one pool attempt reads of the nodes.
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
	// noEntry: nodes listed only in the pool's backendIPConfigurations, with
	// no entry to carry an admin state.
	noEntry map[string]bool
	// changed: nodes whose entries this attempt wrote.
	changed map[string]bool
}

// tickEvents sends at most one event per node, generation and reason among
// the writers started together.
type tickEvents struct {
	mu   sync.Mutex
	seen map[string]bool
}

func newTickEvents() *tickEvents { return &tickEvents{seen: map[string]bool{}} }

// round is one pass of the loop: discovery when needed, then a writer for
// every load balancer with work and no writer yet. Writers run on their own,
// so a slow or throttled load balancer delays no other. It returns how long
// the loop may sleep at most.
func (m *Manager) round(ctx context.Context, writers *sync.WaitGroup) time.Duration {
	ev := newTickEvents()
	if err := m.discover(ctx, ev); err != nil && ctx.Err() == nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing load balancers failed; retrying")
	}
	m.startWriters(ctx, writers, ev)
	return m.nextWake()
}

// tick runs one round and waits for its writers: tests step through rounds.
func (m *Manager) tick(ctx context.Context) time.Duration {
	var writers sync.WaitGroup
	m.round(ctx, &writers)
	writers.Wait()
	return m.nextWake()
}

// startWriters starts a writer for every load balancer that has eligible
// work and none running, at most Workers at once.
func (m *Manager) startWriters(ctx context.Context, writers *sync.WaitGroup, ev *tickEvents) {
	for _, lb := range m.claimWriters() {
		writers.Add(1)
		go func() {
			defer writers.Done()
			defer m.wake() // a finished writer may let another start
			m.runWriter(ctx, lb, ev)
		}()
	}
}

// claimWriters marks as running, and returns, the load balancers to start
// a writer for.
func (m *Manager) claimWriters() []string {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	withWork := map[string]bool{}
	for _, n := range m.nodes {
		if !n.known {
			continue
		}
		for k, w := range n.pools {
			p := m.pools[k]
			if !w.pending || p == nil || withWork[lbKey(p.lb)] {
				continue
			}
			if p.notBefore.After(now) {
				continue
			}
			withWork[lbKey(p.lb)] = true
		}
	}
	for _, p := range m.pools {
		if p.notBefore.After(now) && m.hasPending(p.key) {
			// Parked: no call, no event, no retry count, for old and new work alike.
			parkedTicks.Inc()
		}
	}
	lbs := make([]string, 0, len(withWork))
	for lb := range withWork {
		if !m.writers[lb] {
			lbs = append(lbs, lb)
		}
	}
	sort.Strings(lbs)
	free := max(1, m.cfg.Workers) - len(m.writers)
	if len(lbs) > free {
		lbs = lbs[:max(free, 0)]
	}
	for _, lb := range lbs {
		m.writers[lb] = true
	}
	return lbs
}

func lbKey(lb string) string { return strings.ToLower(lb) }

// hasPending reports whether any node has pending work in a pool. Call with
// m.mu held.
func (m *Manager) hasPending(key string) bool {
	for _, n := range m.nodes {
		if w := n.pools[key]; n.known && w != nil && w.pending {
			return true
		}
	}
	return false
}

// runWriter is a load balancer's one writer: it updates the balancer's pools
// one after another, each with a fresh Get (a pool write changes the ETag
// all of them report), until none has eligible work. Work that arrives
// meanwhile, even for the pool being written, is taken right after.
func (m *Manager) runWriter(ctx context.Context, lb string, ev *tickEvents) {
	for {
		p, ok := m.nextPool(ctx, lb)
		if !ok {
			return
		}
		g, snap, res := m.processPool(ctx, p)
		m.apply(ctx, g, snap, res, ev)
	}
}

// nextPool picks the load balancer's eligible pool served longest ago. With
// none (or on shutdown), it ends the writer.
func (m *Manager) nextPool(ctx context.Context, lb string) (*poolState, bool) {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var pick *poolState
	for _, p := range m.pools {
		if lbKey(p.lb) != lb || p.notBefore.After(now) || !m.hasPending(p.key) {
			continue
		}
		if pick == nil || p.lastAttempt < pick.lastAttempt || (p.lastAttempt == pick.lastAttempt && p.key < pick.key) {
			pick = p
		}
	}
	if pick == nil || ctx.Err() != nil {
		delete(m.writers, lb)
		return nil, false
	}
	m.attempts++
	pick.lastAttempt = m.attempts
	return &poolState{key: pick.key, lb: pick.lb, name: pick.name}, true
}

// snapshotFor reads the nodes' desired states for one attempt at a pool,
// right after its fresh Get, so that the write carries every change made
// until then.
func (m *Manager) snapshotFor(p *poolState) (group, snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := group{pool: p, participants: map[types.UID]uint64{}}
	snap := snapshot{desired: make(map[string]AdminState, len(m.nodes)), gens: make(map[types.UID]uint64, len(m.nodes))}
	idents := make([]backends.Node, 0, len(m.nodes))
	for uid, n := range m.nodes {
		idents = append(idents, n.ident)
		snap.desired[string(uid)] = n.desired
		snap.gens[uid] = n.gen
		if w := n.pools[p.key]; n.known && w != nil && w.pending {
			g.participants[uid] = n.gen
		}
	}
	snap.index = backends.NewIndex(idents)
	return g, snap
}

// processPool makes one attempt at a pool: lock its load balancer, fresh
// Get, set AdminState on every entry whose node's desired state differs, and
// one CreateOrUpdate with If-Match when anything changed.
func (m *Manager) processPool(ctx context.Context, p *poolState) (group, snapshot, result) {
	res := result{matched: map[string]bool{}, noEntry: map[string]bool{}, changed: map[string]bool{}}
	lock := m.lbLock(p.lb)
	start := time.Now()
	lock.Lock()
	lockWait.WithLabelValues(lockLoadBalancer, callerAdminState).Observe(time.Since(start).Seconds())
	defer lock.Unlock()

	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	pool, err := m.client.GetPool(ctx, m.cfg.ResourceGroup, p.lb, p.name)
	g, snap := m.snapshotFor(p)
	if err != nil {
		res.err = fmt.Errorf("getting backend pool %s: %w", p.key, err)
		return g, snap, res
	}
	keys, err := snap.index.Match(ctx, pool, m.nics)
	if err == nil {
		res.noEntry, err = snap.index.WithoutEntry(ctx, pool, keys, m.nics)
	}
	if err != nil {
		res.err = fmt.Errorf("matching nodes to backend pool %s: %w", p.key, err)
		return g, snap, res
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
	if len(res.changed) == 0 {
		return g, snap, res
	}
	if _, err := m.client.UpdatePool(ctx, m.cfg.ResourceGroup, p.lb, pool); err != nil {
		res.err = fmt.Errorf("updating backend pool %s: %w", p.key, err)
		return g, snap, res
	}
	res.wrote = true
	ctrl.LoggerFrom(ctx).V(1).Info("Updated backend pool admin state", "pool", p.key, "entries", len(res.changed))
	return g, snap, res
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
