package armclient

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Operation label values.
const (
	OpListLoadBalancers = "ListLoadBalancers"
	OpGetLoadBalancer   = "GetLoadBalancer"
	OpGetPool           = "GetBackendAddressPool"
	OpUpdatePool        = "CreateOrUpdateBackendAddressPool"
	OpGetInterface      = "GetNetworkInterface"
	OpGetVM             = "GetVirtualMachine"
	metricsNamespace    = "loadbalancer_adminstate"
	labelOperation      = "operation"
	labelCode           = "code"
	codeThrottled       = "throttled"
	codeCanceled        = "canceled"
	codeTransport       = "transport"
	resultLabel         = "result"
	resultSuccess       = "success"
	resultError         = "error"
)

var (
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Name:      "api_request_duration_seconds",
		Help:      "Latency of ARM calls made for load-balancer admin state, by operation and result (success or error), including SDK retries and polling of long-running writes.",
		Buckets:   prometheus.ExponentialBuckets(0.01, 2, 14),
	}, []string{labelOperation, resultLabel})
	requestErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "api_request_errors_total",
		Help:      "ARM calls made for load-balancer admin state that failed, by operation and code (HTTP status, the ARM error code of a failed long-running operation, throttled, canceled or transport).",
	}, []string{labelOperation, labelCode})
	requestThrottled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace,
		Name:      "api_throttled_total",
		Help:      "ARM calls made for load-balancer admin state refused for throttling (a 429 from ARM or the local gate honouring an earlier Retry-After), by operation.",
	}, []string{labelOperation})
)

func init() {
	metrics.Registry.MustRegister(requestDuration, requestErrors, requestThrottled)
}

// Throttled returns the count of throttled calls of an operation (tests).
func Throttled(op string) prometheus.Counter { return requestThrottled.WithLabelValues(op) }

// WithMetrics wraps c so that every call records its latency, errors and
// throttling.
func WithMetrics(c Client) Client { return metered{c} }

type metered struct{ c Client }

func observe(op string, start time.Time, err error) {
	result := resultSuccess
	if err != nil {
		result = resultError
		requestErrors.WithLabelValues(op, errorCode(err)).Inc()
		var te *ThrottleError
		if errors.As(err, &te) {
			requestThrottled.WithLabelValues(op).Inc()
		}
	}
	requestDuration.WithLabelValues(op, result).Observe(time.Since(start).Seconds())
}

func errorCode(err error) string {
	var te *ThrottleError
	var re *azcore.ResponseError
	switch {
	case errors.As(err, &te):
		return codeThrottled
	case errors.As(err, &re):
		if re.StatusCode == 200 && re.ErrorCode != "" {
			return re.ErrorCode
		}
		return strconv.Itoa(re.StatusCode)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return codeCanceled
	}
	return codeTransport
}

func (m metered) ListLoadBalancers(ctx context.Context, rg string) (lbs []*armnetwork.LoadBalancer, err error) {
	defer func(start time.Time) { observe(OpListLoadBalancers, start, err) }(time.Now())
	return m.c.ListLoadBalancers(ctx, rg)
}

func (m metered) GetLoadBalancer(ctx context.Context, rg, name string) (lb *armnetwork.LoadBalancer, err error) {
	defer func(start time.Time) { observe(OpGetLoadBalancer, start, err) }(time.Now())
	return m.c.GetLoadBalancer(ctx, rg, name)
}

func (m metered) GetPool(ctx context.Context, rg, lb, pool string) (p *armnetwork.BackendAddressPool, err error) {
	defer func(start time.Time) { observe(OpGetPool, start, err) }(time.Now())
	return m.c.GetPool(ctx, rg, lb, pool)
}

func (m metered) UpdatePool(ctx context.Context, rg, lb string, pool *armnetwork.BackendAddressPool) (p *armnetwork.BackendAddressPool, err error) {
	defer func(start time.Time) { observe(OpUpdatePool, start, err) }(time.Now())
	return m.c.UpdatePool(ctx, rg, lb, pool)
}

func (m metered) GetInterface(ctx context.Context, id string) (n *armnetwork.Interface, err error) {
	defer func(start time.Time) { observe(OpGetInterface, start, err) }(time.Now())
	return m.c.GetInterface(ctx, id)
}
