package webhook

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
)

// DefaultWarningsWait is how long an admitted delete's answer waits, past
// its decision, for the warnings of what its drain will meet: a node's pods
// are usually listed before the budgets are charged, so this is rarely spent.
const DefaultWarningsWait = 50 * time.Millisecond

// +kubebuilder:rbac:groups="",resources=pods,verbs=list
// +kubebuilder:rbac:groups=apps,resources=replicasets;deployments,verbs=get
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list;watch

// Warnings foresees, while a Node DELETE is decided, what the node's drain
// will meet, for the admission warnings kubectl prints. It never holds the
// decision: warnings not ready within Wait past it are left out.
type Warnings struct {
	// Pods lists a node's pods (the API server: nodeguard caches no pods).
	Pods client.Reader
	// PDBs lists PodDisruptionBudgets and NodeDisruptionBudgets (the
	// manager's cache).
	PDBs client.Reader
	// Settings are the drain's settings (--blocked-pdb-policy, --drain-timeout,
	// --daemonset-pods).
	Settings foresight.Settings
	// Wait is how long an answer waits for them past its decision.
	Wait  time.Duration
	Clock clock.PassiveClock
}

// foreseeing is the warnings of one request, being computed.
type foreseeing struct {
	done   chan struct{}
	cancel context.CancelFunc
	found  []foresight.Finding
	err    error
}

// start begins foreseeing the node's drain, in the background.
func (w *Warnings) start(ctx context.Context, node *corev1.Node) *foreseeing {
	if w == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &foreseeing{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(f.done)
		f.found, f.err = w.foresee(ctx, node)
	}()
	return f
}

// foresee lists the node's pods, the PDBs and the NodeDisruptionBudgets, and
// reads what the drain meets.
func (w *Warnings) foresee(ctx context.Context, node *corev1.Node) ([]foresight.Finding, error) {
	// From the API server's watch cache as it stands (resourceVersion 0), not
	// a consistent read: a warning may miss a pod created a moment ago, and
	// the delete's answer does not wait for the cache to catch up.
	var pods corev1.PodList
	if err := w.Pods.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}); err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node.Name, err)
	}
	if len(pods.Items) == 0 {
		return foresight.Foresee(ctx, node, nil, nil, nil, w.Settings, nil, w.Clock.Now())
	}
	var pdbs policyv1.PodDisruptionBudgetList
	if err := w.PDBs.List(ctx, &pdbs); err != nil {
		return nil, fmt.Errorf("listing PodDisruptionBudgets: %w", err)
	}
	// The budgets' drainTimeout may bring the drain deadline closer.
	var ndbs ngv1alpha1.NodeDisruptionBudgetList
	if err := w.PDBs.List(ctx, &ndbs); err != nil {
		return nil, fmt.Errorf("listing NodeDisruptionBudgets: %w", err)
	}
	return foresight.Foresee(ctx, node, pods.Items, pdbs.Items, ndbs.Items, w.Settings, foresight.DeploymentsFrom(w.Pods), w.Clock.Now())
}

// wait is how long an answer waits for the warnings past its decision.
func (w *Warnings) wait() time.Duration {
	if w == nil {
		return 0
	}
	return w.Wait
}

// collect returns the warnings if they are ready within the wait (and the
// request's own time), else none; either way it stops the work.
func (f *foreseeing) collect(ctx context.Context, wait time.Duration) []string {
	if f == nil {
		return nil
	}
	defer f.cancel()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-f.done:
	case <-timer.C:
		warningsLeftOut.WithLabelValues("late").Inc()
		return nil
	case <-ctx.Done():
		warningsLeftOut.WithLabelValues("late").Inc()
		return nil
	}
	if f.err != nil {
		warningsLeftOut.WithLabelValues("error").Inc()
		log.FromContext(ctx).Error(f.err, "the warnings of an admitted node delete were left out")
		return nil
	}
	out := make([]string, 0, len(f.found))
	for _, found := range f.found {
		warningsGiven.WithLabelValues(string(found.Kind)).Inc()
		out = append(out, found.Message)
	}
	return out
}

// drop stops the work of a request that gets no warnings.
func (f *foreseeing) drop() {
	if f != nil {
		f.cancel()
	}
}

var (
	warningsGiven = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_delete_warnings_total",
		Help: "Warnings returned with admitted Node DELETEs, by kind of what the drain will meet (blocked_pdb, do_not_evict, multiple_pdbs, no_controller, emptydir, drain_deadline).",
	}, []string{"kind"})
	warningsLeftOut = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_delete_warnings_left_out_total",
		Help: "Admitted Node DELETEs answered without their warnings, by cause (late: not ready within the wait past the decision; error: the pods or PDBs could not be read).",
	}, []string{"cause"})
)

func init() {
	metrics.Registry.MustRegister(warningsGiven, warningsLeftOut)
	for _, k := range foresight.Kinds {
		warningsGiven.WithLabelValues(string(k))
	}
	warningsLeftOut.WithLabelValues("late")
	warningsLeftOut.WithLabelValues("error")
}
