package azure

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric label names and values.
const (
	labelLock   = "lock"
	labelCaller = "caller"
	labelResult = "result"
	labelState  = "state"
	labelPool   = "pool"

	lockLoadBalancer = "load_balancer"
	callerAdminState = "AdminStateController"
	resultSuccess    = "success"
	resultFailure    = "failure"
	metricsNamespace = "loadbalancer_adminstate"
)

var (
	lockWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cloudprovider_azure_lock_wait_duration_seconds",
		Help:    "Time spent waiting to acquire a lock that serializes backend pool updates (one per load balancer, whose pools share one ETag), by lock and caller.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{labelLock, labelCaller})
	poolUpdates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "pool_updates_total",
		Help:      "Terminal outcomes of backend pool admin-state updates: success (a write completed) or failure (terminal error or retries exhausted). Retried attempts and stale (404) pools are not counted.",
	}, []string{labelResult})
	parkedTicks = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "throttled_pool_skips_total",
		Help:      "Times a backend pool was skipped because a 429's Retry-After had not passed yet.",
	})
	noEntryDown = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "members_without_entry_total",
		Help:      "Times a node's Down could not be set in a backend pool because the pool lists the node only in backendIPConfigurations, with no backend-address entry to carry an admin state (once per pool and desired-state change), by pool (load balancer/pool).",
	}, []string{labelPool})
	recordWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "record_writes_total",
		Help:      "Writes of the durable record of the backend entries nodeguard set Down (a Lease per pool in kube-node-maintenance), by result. A failed write before a Down is retried; no Down is written unrecorded.",
	}, []string{labelResult})
	recordedEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "recorded_entries",
		Help:      "Backend entries recorded as set Down by nodeguard (nodeguard restores None only on these).",
	})
	restoredEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "restored_entries",
		Help:      "Backend entries nodeguard restored to None and still holds None (recorded, verified) for --azure-admin-state-restore-hold.",
	})
	recordBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "record_bytes",
		Help:      "Size of a backend pool's admin-state record (the entries nodeguard set Down or holds restored, as JSON), by pool (load balancer/pool); absent for a pool with no record. The record is split over Leases of at most 128 KiB each, at most 64 of them: it holds 8 MiB (RecordCapacityBytes), about 50,000 entries, and a save of a larger one fails.",
	}, []string{labelPool})
	recordShards = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "record_shards",
		Help:      "Leases a backend pool's admin-state record is stored in (at most 64), by pool (load balancer/pool), as last read or written.",
	}, []string{labelPool})
	ignoredRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "ignored_records_total",
		Help:      "Leases in kube-node-maintenance that carry an admin-state record but are not nodeguard's record Lease of the pool they name (another name than the one nodeguard derives from the pool): ignored when the records were read (each has a Warning event).",
	})
	unreadableRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "unreadable_records_total",
		Help:      "Record Leases of the entries nodeguard set Down that did not parse when read and were skipped (each has a Warning event).",
	})
	goneRestored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "gone_node_restores_total",
		Help:      "Gone nodes whose recorded Down entries nodeguard restored to None, by reason: replaced (a node of the same name registered with a new UID) or gone (the grace period passed).",
	}, []string{"reason"})
	reverts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "reverts_total",
		Help:      "Entries that a verification, or a write for other nodes, found reverted by another writer and nodeguard set again, by pool (load balancer/pool) and the state set again: Down (an entry of a node held Down found not Down: put back to None or added at None) or None (an entry nodeguard restored found Down within --azure-admin-state-restore-hold: put back from a copy read while the node was Down). Each has a LoadBalancerAdminStateReverted Warning event.",
	}, []string{labelPool, labelState})
	revertOpen = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Name:      "revert_open_seconds",
		Help:      "Time an entry reverted by another writer stayed so after a verification found it, until nodeguard's rewrite confirmed its state again, by pool (load balancer/pool) and the state set again (Down: a node held Down; None: a restored entry). It starts at the finding, so the entry was reverted up to one --azure-admin-state-verify-interval longer.",
		Buckets:   prometheus.ExponentialBuckets(0.5, 2, 10),
	}, []string{labelPool, labelState})
	configurationReady = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace,
		Name:      "configuration_ready",
		Help:      "1 when Azure knew the resource group and every configured load balancer at the last discovery, 0 when it did not (the log says what it did not know): nodes in none of the found backend pools get no traffic cut.",
	})
	confirmDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Name:      "confirmation_duration_seconds",
		Help:      "Time from a node's desired admin state changing to Azure confirming it on all of the node's entries, by state.",
		Buckets:   prometheus.ExponentialBuckets(0.05, 2, 14),
	}, []string{labelState})
)

func init() {
	metrics.Registry.MustRegister(lockWait, poolUpdates, parkedTicks, noEntryDown, recordWrites, recordedEntries, recordBytes, recordShards, restoredEntries, ignoredRecords, unreadableRecords, goneRestored, reverts, revertOpen, configurationReady, confirmDuration)
}
