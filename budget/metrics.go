package budget

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// labelBudget names the NodeDisruptionBudget a series is about.
const labelBudget = "ndb"

var (
	disruptionsAllowed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_ndb_disruptions_allowed",
		Help: "How many more nodes the NodeDisruptionBudget allows to be disrupted now.",
	}, []string{labelBudget})
	expectedNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_ndb_expected_nodes",
		Help: "Number of nodes the NodeDisruptionBudget selects.",
	}, []string{labelBudget})
	availableNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_ndb_available_nodes",
		Help: "Number of selected nodes that are available and not charged with a disruption.",
	}, []string{labelBudget})
	desiredNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_ndb_desired_available_nodes",
		Help: "Number of selected nodes the NodeDisruptionBudget wants available now.",
	}, []string{labelBudget})
	claimConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_ndb_claim_conflicts_total",
		Help: "Status writes of disruption claims that lost a race to a concurrent status write and were retried.",
	})
	claimBatchSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_ndb_claim_batch_size",
		Help:    "Claims charged and releases carried by one successful status write of a NodeDisruptionBudget (group commit).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 8),
	})
	unconfirmedClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_ndb_unconfirmed_claims_total",
		Help: "Disruption claims given back because their node showed no deletion within --unconfirmed-claim-timeout (a delete denied after nodeguard admitted it, or a forged admission review).",
	}, []string{labelBudget})
	// statusWriteDuration and claimDuration split a claim's time: the
	// rounds it waits for, and the status write of its own.
	statusWriteDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_ndb_status_write_duration_seconds",
		Help:    "Duration of one status write of a NodeDisruptionBudget by a claim round (group commit), whatever its outcome.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	})
	claimDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_ndb_claim_duration_seconds",
		Help:    "Time from a disruption claim or release joining its NodeDisruptionBudget's group commit to its verdict: the round in flight, then its own.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	})
	upgradeUnfit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeguard_ndb_upgrade_settings_unfit",
		Help: "1 while the NodeDisruptionBudget's UpgradeSettingsFit condition is False: an AKS upgrade of one of its agent pools would wait on the budget past the pool's drain timeout (the condition names the pool and the settings that fit); 0 otherwise.",
	}, []string{labelBudget})
	claimFreshReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_ndb_claim_fresh_reads_total",
		Help: "Reads of a NodeDisruptionBudget from the API server by claim rounds; the other rounds reuse the object of the replica's own last write.",
	})
)

func init() {
	metrics.Registry.MustRegister(disruptionsAllowed, expectedNodes, availableNodes, desiredNodes, claimConflicts, claimBatchSize, claimFreshReads, unconfirmedClaims,
		statusWriteDuration, claimDuration, upgradeUnfit)
}

// CountClaimConflict counts one retried claim conflict; use as Claimer.OnConflict.
func CountClaimConflict() { claimConflicts.Inc() }

func recordBudgetMetrics(name string, s ngv1alpha1.NodeDisruptionBudgetStatus) {
	disruptionsAllowed.WithLabelValues(name).Set(float64(s.DisruptionsAllowed))
	expectedNodes.WithLabelValues(name).Set(float64(s.ExpectedNodes))
	availableNodes.WithLabelValues(name).Set(float64(s.CurrentAvailable))
	desiredNodes.WithLabelValues(name).Set(float64(s.DesiredAvailable))
	unfit := 0.0
	if c := meta.FindStatusCondition(s.Conditions, ngv1alpha1.ConditionUpgradeSettingsFit); c != nil && c.Status == metav1.ConditionFalse {
		unfit = 1
	}
	upgradeUnfit.WithLabelValues(name).Set(unfit)
}

func forgetBudgetMetrics(name string) {
	for _, g := range []*prometheus.GaugeVec{disruptionsAllowed, expectedNodes, availableNodes, desiredNodes, upgradeUnfit} {
		g.DeleteLabelValues(name)
	}
	unconfirmedClaims.DeleteLabelValues(name)
}
