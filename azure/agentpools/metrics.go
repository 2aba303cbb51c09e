package agentpools

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	reads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_aks_agent_pool_reads_total",
		Help: "Reads of the AKS managed cluster's agent pools (--aks-managed-cluster), by result: success or error.",
	}, []string{"result"})
	poolsRead = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodeguard_aks_agent_pools",
		Help: "How many agent pools the last good read of the AKS managed cluster found.",
	})
)

func init() {
	metrics.Registry.MustRegister(reads, poolsRead)
	// Both results are exported from the start, so that an alert on errors
	// has a series to rate.
	reads.WithLabelValues("success")
	reads.WithLabelValues("error")
}
