package autoscaler

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

const (
	labelResult   = "result"
	resultGranted = "granted"
	resultDenied  = "denied"
)

var (
	scaleDownClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_scale_down_claims_total",
		Help: "Attempts to charge a cluster-autoscaler scale-down to the node's NodeDisruptionBudgets, by result (granted, denied).",
	}, []string{labelResult})
	scaleDownHeld = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "nodeguard_scale_down_hold_seconds",
		Help:    "Time from cluster-autoscaler's scale-down taint to the release of nodeguard's delay-deletion hold (budget claim granted and traffic cut confirmed).",
		Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
	})
)

func init() {
	metrics.Registry.MustRegister(scaleDownClaims, scaleDownHeld)
}
