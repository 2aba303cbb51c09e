package taintwatch

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric label names.
const (
	labelSignal = "signal"
	labelResult = "result"
	labelState  = "state"
)

// Results of a spot-eviction check (label values).
const (
	resultTainted        = "tainted"
	resultAlreadyTainted = "already_tainted"
	resultNoEvent        = "no_event"
	resultNotSpot        = "not_spot"
	resultNotSelected    = "not_selected"
	resultNoticeExpired  = "notice_expired"
)

var (
	nodesSignalled = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_signal_nodes",
		Help: "Nodes currently carrying each signal: out_of_service, shutdown and spot_eviction (taints), draining (nodeguard's draining taint), deleting (being deleted under nodeguard's finalizer).",
	}, []string{labelSignal})
	nodesHeldDown = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodeguard_signal_admin_state_held_nodes",
		Help: "Nodes whose load-balancer entries nodeguard set Down for a signal and will restore to None once it is gone (nodes carrying the nodeguard.io/admin-state-down annotation); a node being deleted is not counted: its entries are restored only once it is gone.",
	})
	adminStateRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_signal_admin_state_requests_total",
		Help: "Times the taint watcher asked the admin-state manager for a new state: Down when a node gained its first signal, None when its last signal went.",
	}, []string{labelState})
	adminStateReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_signal_admin_state_releases_total",
		Help: "Nodes whose entries Azure confirmed back at None, after which nodeguard stopped managing them.",
	})
	spotTaintsAdded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_signal_spot_eviction_taints_added_total",
		Help: "Spot-eviction taints nodeguard added to nodes after a PreemptScheduled event.",
	})
	spotChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_signal_spot_eviction_checks_total",
		Help: "Checks of a node that has PreemptScheduled events, by result: tainted, already_tainted (the taint is the record: nothing to do), no_event (no trusted notice: only events by another writer or about an earlier node of that name, or already handled), not_spot (a notice about a node without the label kubernetes.azure.com/scalesetpriority=spot), not_selected (a notice about a node outside --node-selector), notice_expired (the node still ran past the notice plus --spot-eviction-notice-expiry: the taint nodeguard added was removed, or not added).",
	}, []string{labelResult})
)

func init() {
	metrics.Registry.MustRegister(nodesSignalled, nodesHeldDown, adminStateRequests, adminStateReleases, spotTaintsAdded, spotChecks)
}
