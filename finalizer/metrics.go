package finalizer

import (
	"maps"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/nodeguard/nodeguard/finalizer/drain"
)

// Termination phases, as metric label values.
const (
	phaseLease   = "maintenance_lease"
	phaseCordon  = "cordon"
	phaseTraffic = "traffic_cut"
	// phaseDrainSlot: waiting for one of the --max-concurrent-drains slots.
	phaseDrainSlot = "drain_slot"
	phaseDrain     = "drain"
	phaseVolumes   = "volume_detach"
	phaseRelease   = "release"
	labelPhase     = "phase"
	labelResult    = "result"
	labelCause     = "cause"
)

// Replacement restarts: the namespace label and the results.
const (
	labelNamespace = "namespace"
	restartDone    = "restarted"
	restartFailed  = "failed"
	restartStalled = "stalled"
)

var (
	nodesInPhase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_termination_nodes",
		Help: "Nodes being terminated, by the phase they are in.",
	}, []string{labelPhase})
	evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_evictions_total",
		Help: "Eviction requests by result: evicted, blocked_by_pdb (429 from a PDB), throttled (any other 429), multiple_pdbs (500), already_gone, error, deleted_past_deadline.",
	}, []string{labelResult})
	podsGivenUp = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_drain_pods_given_up_total",
		Help: "Terminating pods a drain stopped waiting for, by cause: stuck (past grace period plus --stuck-pod-margin), unreachable (the node's kubelet is gone), deadline (past the drain deadline).",
	}, []string{labelCause})
	replacementRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_replacement_restarts_total",
		Help: "Deployments restarted so that pods under a PodDisruptionBudget blocked by design are replaced before they stop, by namespace and result: restarted, failed (the API server refused the restart), stalled (a new pod was not Ready within --replacement-timeout, so the drain fell back to waiting).",
	}, []string{labelNamespace, labelResult})
	drainDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_drain_duration_seconds",
		Help:    "Time from the start of a node's termination (cordon) until its pods are gone.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
	wakeupDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_drain_wakeup_delay_seconds",
		Help:    "Time from a PodDisruptionBudget status change that allows a disruption, as nodeguard's watch delivers it, to the eviction request it sends for a queue that waited on that PDB.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	slotHandoff = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_drain_slot_handoff_seconds",
		Help:    "Time from a draining node's last pod gone, as nodeguard's watch of its pods delivers it, to the first eviction request of the node waiting in line that takes its drain slot (--max-concurrent-drains).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	slotsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodeguard_drain_slots_held",
		Help: "Draining nodes that hold one of the --max-concurrent-drains slots. The other draining nodes (nodeguard_termination_nodes{phase=\"drain\"} less these) stepped aside: each waits for its PodDisruptionBudgets to allow its next eviction, or for another node's eviction under the same PDB.",
	})
	trafficCuts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_traffic_cuts_total",
		Help: "Load-balancer traffic cuts of terminating nodes by outcome, once per node and outcome: confirmed (AdminState Down on every backend entry), failed (a pool's write failed for good: traffic NOT cut there) timed_out (not confirmed within --admin-state-timeout) or no_backend_pool (the node is in no backend pool of the managed load balancers: nothing was cut). With --traffic-cut-failure=drain the drain goes on after failed and timed_out; it always goes on after no_backend_pool.",
	}, []string{labelResult})
	drainChargesWithdrawn = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_drain_charges_withdrawn_total",
		Help: "Charges of drains nodeguard did not start that it withdrew (marks removed, disruption given back, traffic restored) because no eviction from the node was carried out or asked again within --unconfirmed-claim-timeout of the charging eviction review: a forged review, or a drainer that gave up.",
	})
	terminationDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_termination_duration_seconds",
		Help:    "Time from a node's deletion until nodeguard released it.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 14),
	})
)

func init() {
	metrics.Registry.MustRegister(nodesInPhase, evictions, podsGivenUp, replacementRestarts, drainDuration, wakeupDelay, slotHandoff, slotsHeld, trafficCuts, terminationDuration, drainChargesWithdrawn)
	for _, c := range []string{drain.GiveUpStuck, drain.GiveUpUnreachable, drain.GiveUpDeadline} {
		podsGivenUp.WithLabelValues(c)
	}
	for _, c := range []string{cutConfirmed, cutFailed, cutTimedOut} {
		trafficCuts.WithLabelValues(c)
	}
	for _, p := range []string{phaseLease, phaseCordon, phaseTraffic, phaseDrainSlot, phaseDrain, phaseVolumes, phaseRelease} {
		nodesInPhase.WithLabelValues(p)
	}
}

// ObserveEviction counts one eviction result; use as drain.Evictor.Observe.
func ObserveEviction(result string) { evictions.WithLabelValues(result).Inc() }

// phases tracks which phase each terminating node is in, for the gauge.
type phases struct {
	mu     sync.Mutex
	byNode map[types.UID]string
	names  map[types.UID]string
}

func (p *phases) set(uid types.UID, name, phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byNode == nil {
		p.byNode = map[types.UID]string{}
		p.names = map[types.UID]string{}
	}
	p.names[uid] = name
	if old, ok := p.byNode[uid]; ok {
		if old == phase {
			return
		}
		nodesInPhase.WithLabelValues(old).Dec()
	}
	p.byNode[uid] = phase
	nodesInPhase.WithLabelValues(phase).Inc()
}

// nodes names the nodes in a phase, by UID.
func (p *phases) nodes() map[types.UID]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.names)
}

// count is how many nodes are in a phase.
func (p *phases) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byNode)
}

// uids are the terminating nodes of the name (one, unless a node of that
// name was recreated).
func (p *phases) uids(name string) []types.UID {
	p.mu.Lock()
	defer p.mu.Unlock()
	var uids []types.UID
	for uid, n := range p.names {
		if n == name {
			uids = append(uids, uid)
		}
	}
	return uids
}

// draining names the node of that name whose last pass came to the drain
// slot or the drain.
func (p *phases) draining(name string) (types.UID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid, n := range p.names {
		if n == name && (p.byNode[uid] == phaseDrainSlot || p.byNode[uid] == phaseDrain) {
			return uid, true
		}
	}
	return "", false
}

func (p *phases) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.byNode[uid]; ok {
		nodesInPhase.WithLabelValues(old).Dec()
		delete(p.byNode, uid)
		delete(p.names, uid)
	}
}
