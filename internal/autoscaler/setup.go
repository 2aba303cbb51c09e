package autoscaler

import (
	"flag"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/budget"
)

// Options are what cmd/nodeguard hands the cluster-autoscaler support.
type Options struct {
	// Hold is --cluster-autoscaler-scale-down-hold: false only removes what
	// nodeguard put on nodes.
	Hold    bool
	Managed labels.Selector
	// Rule decides a scale-down: the deletion doors' rule (budget.Rules).
	Rule    *budget.Rule
	Signals azure.Signals
	// AdminState is nil when Azure is not configured; AdminStateTimeout is
	// --admin-state-timeout.
	AdminState        TrafficCut
	AdminStateTimeout time.Duration
}

// BindFlags registers --cluster-autoscaler-scale-down-hold on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Hold, "cluster-autoscaler-scale-down-hold", true,
		"Charge cluster-autoscaler's scale-downs to NodeDisruptionBudgets: keep the annotation "+ngv1alpha1.DelayDeletionAnnotation+" on every managed node, "+
			"and remove it from a node tainted "+ngv1alpha1.ClusterAutoscalerTaintKey+" once every budget of the node admitted the scale-down and its traffic cut is confirmed. "+
			"cluster-autoscaler waits for it up to its --node-deletion-delay-timeout (2m by default) before it deletes the VM. false removes the annotations nodeguard set.")
}

// Setup adds the scale-down hold and the scale-down-disabled annotation's
// controller.
func Setup(mgr ctrl.Manager, opts Options) error {
	recorder := mgr.GetEventRecorder("nodeguard-scale-down")
	hold := &HoldReconciler{Client: mgr.GetClient(), Rule: opts.Rule, Managed: opts.Managed, Recorder: recorder, Clock: clock.RealClock{},
		AdminState: opts.AdminState, AdminStateTimeout: opts.AdminStateTimeout, Disabled: !opts.Hold, Signals: opts.Signals}
	if err := hold.SetupWithManager(mgr); err != nil {
		return err
	}
	return (&ScaleDownReconciler{Client: mgr.GetClient(), Managed: opts.Managed, Clock: clock.RealClock{},
		Recorder: recorder}).SetupWithManager(mgr)
}
