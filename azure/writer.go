package azure

import (
	"context"
	"fmt"
	"maps"
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

// snapshot is what one pool attempt reads of the nodes and the pool's
// record.
type snapshot struct {
	index   *backends.Index       // live nodes only
	desired map[string]AdminState // by node UID
	gens    map[types.UID]uint64
	names   map[types.UID]string
	// due: gone nodes whose recorded entries are to be restored now.
	due    map[types.UID]bool
	record poolRecord
	// now and hold date the restores this attempt records and end the holds
	// past their window; ended: nodes of restored entries known deleted or
	// replaced; reverted: the pool's restored entries a verification found
	// Down, with when (restore.go).
	now      time.Time
	hold     time.Duration
	ended    map[types.UID]bool
	reverted map[string]time.Time
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
	// restoredAgain: restored entries this attempt set None again.
	restoredAgain poolRecord
	// recordErr: the record could not be saved before the write, which
	// then set no entry Down; held: the nodes whose Down waits for it (the
	// write carried the other nodes' restores).
	recordErr error
	held      map[string]bool
	// left: nodes whose recorded entries were no longer in the pool.
	left map[string]bool
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
	if err := m.loadRecords(ctx); err != nil {
		if ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "Reading the admin-state records failed; no backend pool is written until they are read")
		}
		return m.cfg.RetryInterval
	}
	m.reviewGone(ctx)
	m.reviewRestored(ctx)
	m.retryFailed()
	if err := m.discover(ctx, ev); err != nil && ctx.Err() == nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing load balancers failed; retrying")
	}
	// Writers start before the verification's read and again after it: a
	// slow or throttled read never holds back a cut that is already due.
	m.startWriters(ctx, writers, ev)
	if m.verify(ctx, ev) {
		m.startWriters(ctx, writers, ev)
	}
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
		if len(p.reverted) > 0 && !p.notBefore.After(now) {
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

// hasPending reports whether any node has pending work in a pool, or a
// restored entry is to be set None again. Call with m.mu held.
func (m *Manager) hasPending(key string) bool {
	if m.restorePending(key) {
		return true
	}
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

// snapshotFor reads the nodes' desired states and the pool's record for one
// attempt at a pool, right after its fresh Get, so that the write carries
// every change made until then.
func (m *Manager) snapshotFor(p *poolState) (group, snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := group{pool: p, participants: map[types.UID]uint64{}}
	snap := snapshot{
		desired: make(map[string]AdminState, len(m.nodes)), gens: make(map[types.UID]uint64, len(m.nodes)),
		names: make(map[types.UID]string, len(m.nodes)), due: map[types.UID]bool{}, record: maps.Clone(m.recorded[p.key]),
		now: m.clock.Now(), hold: m.cfg.RestoreHold, ended: maps.Clone(m.holdEnded),
	}
	if ps := m.pools[p.key]; ps != nil {
		snap.reverted = maps.Clone(ps.reverted)
	}
	idents := make([]backends.Node, 0, len(m.nodes))
	for uid, n := range m.nodes {
		snap.gens[uid] = n.gen
		snap.names[uid] = n.name
		if w := n.pools[p.key]; n.known && w != nil && w.pending {
			g.participants[uid] = n.gen
		}
		if n.gone != nil {
			snap.due[uid] = n.gone.due != ""
			continue
		}
		idents = append(idents, n.ident)
		snap.desired[string(uid)] = n.desired
	}
	snap.index = backends.NewIndex(idents)
	return g, snap
}

// processPool makes one attempt at a pool: lock its load balancer, fresh
// Get, plan the entries' admin state (planPool), record the entries it sets
// Down, write with If-Match when anything changed, then record the entries
// it restored as held None (restore.go), or drop them.
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
	states := adminStates(pool)
	plan := planPool(pool, keys, snap, snap.record, false)
	if plan.before != nil {
		// Recorded before the write: a crash after it never leaves a Down
		// that nobody restores.
		if err := m.saveRecord(ctx, p.key, plan.before); err != nil {
			// No Down goes unrecorded, but a save that cannot be made (the
			// API server down, a record too large) must not hold back the
			// restores planned beside the Downs: plan again without them.
			// The record of the restores is fixed by the pool's next save.
			setAdminStates(pool, states)
			plan = planPool(pool, keys, snap, snap.record, true)
			res.matched, res.restoredAgain, res.held, res.left = plan.matched, plan.restoredAgain, plan.held, plan.left
			if len(plan.changed) == 0 {
				res.err = err
				return g, snap, res
			}
			res.recordErr = err
		}
	}
	res.matched, res.changed, res.restoredAgain, res.held, res.left = plan.matched, plan.changed, plan.restoredAgain, plan.held, plan.left
	if len(res.changed) > 0 {
		if _, err := m.client.UpdatePool(ctx, m.cfg.ResourceGroup, p.lb, pool); err != nil {
			res.err = fmt.Errorf("updating backend pool %s: %w", p.key, err)
			return g, snap, res
		}
		res.wrote = true
		ctrl.LoggerFrom(ctx).V(1).Info("Updated backend pool admin state", "pool", p.key, "entries", len(res.changed))
	}
	if plan.after != nil {
		if err := m.saveRecord(ctx, p.key, plan.after); err != nil {
			// The record stays as it was: the pool's next attempt (at the
			// latest the resync) brings it up to date.
			ctrl.LoggerFrom(ctx).Error(err, "Recording restored entries in the admin-state record failed", "pool", p.key)
		}
	}
	return g, snap, res
}

// adminStates keeps a pool's entries' admin states, for setAdminStates.
func adminStates(pool *armnetwork.BackendAddressPool) []*armnetwork.LoadBalancerBackendAddressAdminState {
	if pool == nil || pool.Properties == nil {
		return nil
	}
	out := make([]*armnetwork.LoadBalancerBackendAddressAdminState, len(pool.Properties.LoadBalancerBackendAddresses))
	for i, e := range pool.Properties.LoadBalancerBackendAddresses {
		if e != nil && e.Properties != nil {
			out[i] = e.Properties.AdminState
		}
	}
	return out
}

// setAdminStates puts back the admin states adminStates kept.
func setAdminStates(pool *armnetwork.BackendAddressPool, states []*armnetwork.LoadBalancerBackendAddressAdminState) {
	if pool == nil || pool.Properties == nil {
		return
	}
	for i, e := range pool.Properties.LoadBalancerBackendAddresses {
		if e != nil && e.Properties != nil && i < len(states) {
			e.Properties.AdminState = states[i]
		}
	}
}
