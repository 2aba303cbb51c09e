package webhook

import (
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
)

// Options configure the guard.
type Options struct {
	// Managed selects the nodes nodeguard manages (labels.Everything() for all).
	Managed labels.Selector
	// DeleteTimeout is the time budget of one DELETE decision.
	DeleteTimeout time.Duration
	// Instances says whether a node's cloud instance exists (nil: no cloud).
	Instances budget.InstanceChecker
	// Claimer charges budgets; share it with the status controller (nil: a
	// claimer of the webhook's own, with Signals).
	Claimer *budget.Claimer
	// Signals are the configured signal taints (nil: the defaults).
	Signals *ngv1alpha1.Signals
	// IgnoreOutsideDrains admits every eviction (--outside-drains=false);
	// otherwise the evictions of drains nodeguard did not start count
	// against the budgets.
	IgnoreOutsideDrains bool
	// DrainRule decides the first eviction of someone else's drain (nil: a
	// rule over Claimer and Instances).
	DrainRule *budget.Rule
	// Traffic is how evictions of a charged drain wait for its traffic cut
	// (zero: no Azure, no wait).
	Traffic TrafficGate
}

// Register serves the webhooks on the manager's webhook server. Every replica
// serves them; the Backfill controller is set up separately (it runs on the
// leader only).
func Register(mgr ctrl.Manager, opts Options) error {
	recorder := mgr.GetEventRecorder("nodeguard-webhook")
	server := mgr.GetWebhookServer()
	claimer := opts.Claimer
	if claimer == nil {
		claimer = budget.NewClaimer(mgr, opts.Signals)
	}
	server.Register(FinalizerPath, &webhook.Admission{Handler: &FinalizerHandler{Managed: opts.Managed, Clock: clock.RealClock{}}})
	server.Register(BudgetPath, &webhook.Admission{Handler: &BudgetValidator{}})
	server.Register(DeletePath, &webhook.Admission{Handler: &DeleteHandler{
		Client:   mgr.GetClient(),
		Reader:   mgr.GetAPIReader(),
		Budgets:  mgr.GetClient(),
		Claimer:  claimer,
		Managed:  opts.Managed,
		Recorder: recorder,
		Clock:    clock.RealClock{},
		Timeout:  opts.DeleteTimeout,

		Instances: opts.Instances,
	}})
	server.Register(NodeClaimDeletePath, &webhook.Admission{Handler: &NodeClaimDeleteHandler{
		Client: mgr.GetClient(), Nodes: mgr.GetClient(), Budgets: mgr.GetClient(), Reader: mgr.GetAPIReader(),
		Claimer: claimer,
		Managed: opts.Managed, Recorder: recorder, Clock: clock.RealClock{}, Timeout: opts.DeleteTimeout,
		Instances: opts.Instances,
	}})
	return registerEviction(mgr, opts, claimer, recorder)
}

// registerEviction serves the eviction webhook, with the pod locator it reads.
func registerEviction(mgr ctrl.Manager, opts Options, claimer *budget.Claimer, recorder events.EventRecorder) error {
	if opts.IgnoreOutsideDrains {
		mgr.GetWebhookServer().Register(EvictionPath, &webhook.Admission{Handler: &EvictionHandler{Off: true}})
		return nil
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	pods := NewPodNodes(cs, mgr.GetAPIReader())
	if err := mgr.Add(pods); err != nil {
		return err
	}
	rule := opts.DrainRule
	if rule == nil {
		rule = &budget.Rule{Claimer: claimer, Budgets: mgr.GetClient(), Instances: opts.Instances, Clock: clock.RealClock{}}
	}
	mgr.GetWebhookServer().Register(EvictionPath, &webhook.Admission{Handler: &EvictionHandler{
		Pods: pods, Nodes: mgr.GetClient(), Reader: mgr.GetAPIReader(), Client: mgr.GetClient(),
		Rule:    rule,
		Managed: opts.Managed, Signals: opts.Signals, Traffic: opts.Traffic,
		Recorder: recorder, Clock: clock.RealClock{}, Timeout: DefaultEvictionTimeout,
	}})
	return nil
}
