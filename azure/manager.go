package azure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/backends"
	"github.com/nodeguard/nodeguard/azure/config"
)

// Manager holds the desired admin state of every node and applies it to the
// backend pools of the managed load balancers. It is a manager.Runnable that
// needs leader election.
type Manager struct {
	cfg      *config.Config
	client   armclient.Client
	nics     *backends.NICCache
	recorder events.EventRecorder
	clock    clock.WithTicker
	log      logr.Logger

	// trigger wakes the loop: new work, or a writer finished.
	trigger chan struct{}
	stopped chan struct{}
	stopMu  sync.Once

	lockMu  sync.Mutex
	lbLocks map[string]*sync.Mutex

	mu    sync.Mutex
	nodes map[types.UID]*nodeState
	pools map[string]*poolState
	// writers: the load balancers whose writer goroutine is running.
	writers map[string]bool
	// attempts numbers pool attempts, so that a writer takes the pool it
	// served longest ago first.
	attempts    uint64
	discovered  bool
	nextResync  time.Time
	discoverErr error
	// unknown says what of the configuration ARM does not know ("" when
	// discovery found all of it): see configuration.go.
	unknown string

	records    RecordStore
	nodeReader client.Reader
	// recorded mirrors the records: by pool key, the entries nodeguard set
	// Down and for which node. nil until loaded; no writer runs before.
	recorded   map[string]poolRecord
	nextReview time.Time
	// holdEnded: nodes of restored entries known deleted or replaced, or
	// carrying a taint cloud-provider-azure sets Down on: their holds end
	// (restore.go); nextRestoreReview: when the node cache is next asked.
	holdEnded         map[types.UID]bool
	nextRestoreReview time.Time

	// lastVerify and nextVerify schedule the re-reads of the pools while a
	// node is held Down (verify.go).
	lastVerify, nextVerify time.Time
}

// nodeState is one node's desired state and progress.
type nodeState struct {
	uid     types.UID
	name    string
	ident   backends.Node
	identV  uint64
	desired AdminState
	gen     uint64
	since   time.Time
	// known: membership was discovered for identV.
	known bool
	// pools: the node's work per backend pool key.
	pools map[string]*work
	// changed: nodeguard wrote one of the node's entries for gen.
	changed bool
	// member: a discovery found the node in a backend pool; excluded: it
	// carries the label that keeps cloud providers from adding it to load
	// balancers. A node in no pool with neither had nothing to cut.
	member, excluded bool
	// deleting: the node is being deleted under nodeguard's finalizer; the
	// termination controller reports its cut (NodeReleased, the TrafficCut
	// condition).
	deleting  bool
	confirmed bool
	failed    error
	notify    chan struct{}
	// warned: pools whose missing entry was reported for gen.
	warned map[string]bool
	// left: pools the node's entries left while it was held Down for gen
	// (their owner removed them: a harder cut than Down), for CutNote.
	left map[string]bool
	// gone is set for a node that no longer exists but still has entries
	// recorded Down: it has no identity to match, only its record.
	gone *goneState
}

// work is a node's state in one pool.
type work struct {
	pending bool
	// retries spent on retriable errors in this attempt series (busy
	// answers and 412s spend none).
	retries int
	failed  bool
	// failures counts the series that ended failed since the desired state
	// last changed: it sets the backoff before the next series, and only
	// the first is reported.
	failures int
	// retryAt is when a failed entry is tried again (retryFailed).
	retryAt time.Time
	// busyReported: the load balancer's "another operation" answer was
	// reported in this series.
	busyReported bool
	// openSince is when a verification found the entry of a node held Down
	// not Down; zero when it was not found so.
	openSince time.Time
}

// again makes the entry pending for a new attempt series, keeping what
// outlives one: the failures behind it and since when it is open.
func (w *work) again() {
	*w = work{pending: true, failures: w.failures, openSince: w.openSince}
}

// poolState is one backend pool's group state.
type poolState struct {
	key, lb, name string
	// notBefore parks the pool: no call before it (429 Retry-After, or the
	// retry interval after a retriable failure).
	notBefore time.Time
	// lastAttempt is the attempt number of the pool's last attempt.
	lastAttempt uint64
	// conflicts counts the 412s in a row: each re-reads the pool at once,
	// and a run of them backs off (conflictDelay).
	conflicts int
	// writes counts nodeguard's completed writes to the pool: a
	// verification that read the pool before one of them ignores it.
	writes uint64
	// reverted: restored entries a verification found Down, by entry name,
	// with when: the pool's next attempt sets them None again (restore.go).
	reverted map[string]time.Time
}

// NewManager builds the manager from the flags. It returns (nil, nil) when no
// Azure configuration was given at all: admin state is disabled, and the
// caller logs that once.
func NewManager(o Options, recorder events.EventRecorder, opts ...ManagerOption) (*Manager, error) {
	cfg, err := o.Load()
	if errors.Is(err, config.ErrNotConfigured) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return NewManagerFromConfig(cfg, recorder, opts...)
}

// NewManagerFromConfig builds the manager from a resolved configuration.
func NewManagerFromConfig(cfg *config.Config, recorder events.EventRecorder, opts ...ManagerOption) (*Manager, error) {
	s := managerSettings{clock: clock.RealClock{}, log: ctrl.Log.WithName("azure-admin-state")}
	for _, o := range opts {
		o(&s)
	}
	client := s.client
	if client == nil {
		cred := s.credential
		if cred == nil {
			var err error
			if cred, err = cfg.NewCredential(azcore.ClientOptions{Transport: s.transport}); err != nil {
				return nil, fmt.Errorf("azure credential (%s): %w", cfg.Credential.Kind, err)
			}
		}
		var err error
		retry := s.retry
		if retry.TryTimeout == 0 {
			// A hung try ends early enough for the SDK to try again within
			// the attempt's --azure-request-timeout.
			retry.TryTimeout = cfg.RequestTimeout / tryTimeoutDivisor
		}
		client, err = armclient.New(armclient.Settings{
			SubscriptionID: cfg.SubscriptionID, Credential: cred, Cloud: cfg.Cloud,
			InsecureAllowHTTP: cfg.InsecureAllowHTTP, Retry: retry, PollFrequency: s.pollFrequency,
			Clock: s.clock, Transport: s.transport,
		})
		if err != nil {
			return nil, err
		}
		client = armclient.WithMetrics(client)
	}
	m := &Manager{
		cfg: cfg, client: client, recorder: recorder, clock: s.clock, log: s.log,
		trigger: make(chan struct{}, 1), stopped: make(chan struct{}),
		lbLocks: map[string]*sync.Mutex{}, nodes: map[types.UID]*nodeState{}, pools: map[string]*poolState{},
		writers: map[string]bool{}, holdEnded: map[types.UID]bool{},
	}
	m.nics = backends.NewNICCache(client.GetInterface, s.clock, cfg.ResyncInterval, cfg.RetryInterval)
	m.records, m.nodeReader = s.records, s.nodes
	if m.records == nil {
		m.records = NewMemoryRecords()
	}
	return m, nil
}

// Config is the resolved configuration.
func (m *Manager) Config() *config.Config { return m.cfg }

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader writes backend pools.
func (m *Manager) NeedLeaderElection() bool { return true }

// SetDesired records the desired admin state of a node (keyed by its UID;
// its name, InternalIPs and providerID find its entries) and wakes the
// workers when anything changed.
func (m *Manager) SetDesired(node *corev1.Node, state AdminState) {
	if node == nil {
		return
	}
	ident := backends.FromNode(node)
	m.mu.Lock()
	m.replacedBy(node.Name, node.UID)
	n, ok := m.nodes[node.UID]
	changed := false
	if !ok {
		n = &nodeState{uid: node.UID, name: node.Name, ident: ident, pools: map[string]*work{}, notify: make(chan struct{})}
		m.nodes[node.UID] = n
		changed = true
	}
	if ok && !sameIdent(n.ident, ident) {
		n.ident, n.name = ident, node.Name
		n.identV++
		n.known = false
		n.confirmed = false
		changed = true
	}
	_, n.excluded = node.Labels[corev1.LabelNodeExcludeBalancers]
	n.deleting = ngv1alpha1.TerminatingUnderFinalizer(node)
	if !ok || n.desired != state {
		n.desired = state
		n.gen++
		n.since = m.clock.Now()
		n.changed, n.confirmed, n.failed, n.warned, n.left = false, false, nil, map[string]bool{}, nil
		for _, w := range n.pools {
			*w = work{pending: true}
		}
		n.signal()
		changed = true
	}
	var events []pendingEvent
	if !n.known && m.discovered {
		m.assumeMember(n)
		// In no pool at all: nothing to wait for.
		events = m.updateConfirmed(n)
	}
	m.mu.Unlock()
	m.emit(newTickEvents(), events)
	if changed {
		m.wake()
	}
}

// assumeMember gives a node whose membership is unknown pending work in
// every known pool: the pool's fresh Get, which a write needs anyway, tells
// whether it is a member, so no listing delays its first write. Call with
// m.mu held.
func (m *Manager) assumeMember(n *nodeState) {
	n.pools = make(map[string]*work, len(m.pools))
	for k := range m.pools {
		n.pools[k] = &work{pending: true}
	}
	n.known = true
}

func sameIdent(a, b backends.Node) bool {
	return a.Name == b.Name && a.ProviderID == b.ProviderID && slices.Equal(a.IPs, b.IPs)
}

// Forget drops a node: deleted, or one nodeguard no longer sets admin state
// for. Entries nodeguard recorded Down for it are restored once a node of the
// same name replaces it, or after --azure-admin-state-gone-node-grace; entries
// it restored stay held None for --azure-admin-state-restore-hold, unless the
// node turns out deleted (restore.go).
func (m *Manager) Forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[uid]
	if !ok || n.gone != nil {
		return
	}
	delete(m.nodes, uid)
	n.signal()
	if m.ownsEntries(uid) {
		m.markGone(uid, n.name, m.clock.Now())
		m.wake()
	}
}

// WaitConfirmed returns nil once Azure has confirmed state on every entry of
// the node (at once when it has none). It returns an *UpdateFailedError when
// applying that state failed for good in a pool, once every other pool of the
// node has confirmed or failed too: a pool that fails at once (a NIC-only
// pool, a 403) never ends the wait while the node's other writes are still
// in flight. It returns ErrNotTracked or ErrForgotten for a node the manager
// does not know, ErrStopped when the manager stops, or the context's error.
func (m *Manager) WaitConfirmed(ctx context.Context, uid types.UID, state AdminState) error {
	for {
		m.mu.Lock()
		n, ok := m.nodes[uid]
		if !ok {
			m.mu.Unlock()
			return ErrNotTracked
		}
		if n.gone != nil {
			m.mu.Unlock()
			return ErrForgotten
		}
		if n.desired == state && n.confirmed {
			m.mu.Unlock()
			return nil
		}
		if n.desired == state && n.failed != nil && !n.hasPendingWork() {
			err := n.failed
			m.mu.Unlock()
			return err
		}
		ch := n.notify
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.stopped:
			return ErrStopped
		case <-ch:
			m.mu.Lock()
			cur, still := m.nodes[uid]
			m.mu.Unlock()
			if !still || cur != n {
				return ErrForgotten
			}
		}
	}
}

// signal wakes the node's waiters. Call with m.mu held.
func (n *nodeState) signal() {
	close(n.notify)
	n.notify = make(chan struct{})
}

func (m *Manager) wake() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// Start runs the workers until ctx ends. Parked and pending work is dropped
// at shutdown without events.
func (m *Manager) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("azure-admin-state")
	if log.GetSink() == nil {
		log = m.log
	}
	ctx = ctrl.LoggerInto(ctx, log)
	log.Info("Starting load-balancer admin-state manager", "subscription", m.cfg.SubscriptionID,
		"resourceGroup", m.cfg.ResourceGroup, "loadBalancers", m.cfg.LoadBalancers, "credential", m.cfg.Credential.Kind)
	var writers sync.WaitGroup
	defer m.stopMu.Do(func() { close(m.stopped) })
	defer writers.Wait()
	for {
		next := m.round(ctx, &writers)
		if ctx.Err() != nil {
			return nil
		}
		t := m.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-m.trigger:
		case <-t.C():
		}
		t.Stop()
	}
}

// lbLock serialises writes to one load balancer's pools (they share its
// ETag) across the manager's writers and ticks.
func (m *Manager) lbLock(lb string) *sync.Mutex {
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	k := strings.ToLower(lb)
	l, ok := m.lbLocks[k]
	if !ok {
		l = &sync.Mutex{}
		m.lbLocks[k] = l
	}
	return l
}

// regarding is the object events are about.
func regarding(n *nodeState) *corev1.Node {
	return &corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: n.name, UID: n.uid},
	}
}
