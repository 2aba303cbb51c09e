package webhook

import (
	"context"
	"errors"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
	"github.com/nodeguard/nodeguard/upgrade"
)

// Options configure the guard.
type Options struct {
	// Managed selects the nodes nodeguard manages (labels.Everything() for all).
	Managed labels.Selector
	// DeleteTimeout is the time budget of one DELETE decision.
	DeleteTimeout time.Duration
	// Rules decide the doors: Deletion the Node and NodeClaim DELETEs, Drain
	// the first eviction of someone else's drain. Built once at start-up
	// (budget.NewRules), over the claimer the status controller shares.
	Rules budget.Rules
	// Signals are the configured signal taints (nil: the defaults).
	Signals *ngv1alpha1.Signals
	// IgnoreOutsideDrains admits every eviction (--outside-drains=false);
	// otherwise the evictions of drains nodeguard did not start count
	// against the budgets.
	IgnoreOutsideDrains bool
	// Traffic is how evictions of a charged drain wait for its traffic cut
	// (zero: no Azure, no wait).
	Traffic TrafficGate
	// Drain is the finalizer's drain settings, for the warnings an admitted
	// delete returns of what its drain will meet (nil: no warnings).
	Drain *foresight.Settings
	// WarningsWait is how long an admitted delete's answer waits for those
	// warnings past its decision (zero: no warnings).
	WarningsWait time.Duration
	// Upgrades gives the AKS agent pools' upgrade settings, for the warning a
	// budget write gets when an upgrade would outlast a pool's drain timeout
	// under it (nil: no such warning); UpgradeNodeTime is --upgrade-node-time.
	Upgrades        upgrade.Source
	UpgradeNodeTime time.Duration
}

// Register serves the webhooks on the manager's webhook server. Every replica
// serves them; what the leader runs beside them is SetupLeader's.
func Register(mgr ctrl.Manager, opts Options) error {
	if opts.Rules.Deletion == nil || opts.Rules.Drain == nil {
		return errors.New("webhook.Register: Options.Rules has no deletion or no drain rule")
	}
	recorder := mgr.GetEventRecorder("nodeguard-webhook")
	server := mgr.GetWebhookServer()
	warnings, err := warningsFor(mgr, opts)
	if err != nil {
		return err
	}
	// The handlers read nodes from the cache, and budget claims start from
	// the cached budgets (the set a decision charges is listed fresh:
	// budget.Rule): their informers start with the manager, on every
	// replica (the controllers that would start them run on the leader
	// only), so that a replica's readiness waits for them and its first
	// admission does not.
	for _, obj := range []client.Object{&corev1.Node{}, &ngv1alpha1.NodeDisruptionBudget{}} {
		if _, err := mgr.GetCache().GetInformer(context.Background(), obj, cache.BlockUntilSynced(false)); err != nil {
			return err
		}
	}
	server.Register(FinalizerPath, &webhook.Admission{Handler: &FinalizerHandler{Managed: opts.Managed, Clock: clock.RealClock{}}})
	server.Register(BudgetPath, &webhook.Admission{Handler: &BudgetValidator{
		Nodes: mgr.GetClient(), Upgrades: opts.Upgrades, UpgradeNodeTime: opts.UpgradeNodeTime,
	}})
	server.Register(DeletePath, &webhook.Admission{Handler: &DeleteHandler{
		Client:   mgr.GetClient(),
		Reader:   mgr.GetAPIReader(),
		Rule:     opts.Rules.Deletion,
		Managed:  opts.Managed,
		Recorder: recorder,
		Clock:    clock.RealClock{},
		Timeout:  opts.DeleteTimeout,
		Warnings: warnings,
	}})
	server.Register(NodeClaimDeletePath, &webhook.Admission{Handler: &NodeClaimDeleteHandler{
		Client: mgr.GetClient(), Nodes: mgr.GetClient(), Rule: opts.Rules.Deletion,
		Managed: opts.Managed, Recorder: recorder, Clock: clock.RealClock{}, Timeout: opts.DeleteTimeout,
	}})
	return registerEviction(mgr, opts, recorder)
}

// SetupLeader adds what the leader runs beside the webhooks: the backfill of
// the finalizer on nodes the webhook did not see (SetupBackfill), and the
// check of the webhooks' objectSelector against --node-selector (ScopeCheck).
func SetupLeader(mgr ctrl.Manager, managed labels.Selector) error {
	if err := SetupBackfill(mgr, managed); err != nil {
		return err
	}
	return mgr.Add(&ScopeCheck{Reader: mgr.GetAPIReader(), Managed: managed, Recorder: mgr.GetEventRecorder("nodeguard-webhook")})
}

// warningsFor foresees drains with the drain's settings, if given. The
// PodDisruptionBudget informer starts with the manager, so that the first
// delete finds it synced.
func warningsFor(mgr ctrl.Manager, opts Options) (*Warnings, error) {
	if opts.Drain == nil || opts.WarningsWait <= 0 {
		return nil, nil
	}
	if _, err := mgr.GetCache().GetInformer(context.Background(), &policyv1.PodDisruptionBudget{}, cache.BlockUntilSynced(false)); err != nil {
		return nil, err
	}
	return &Warnings{Pods: mgr.GetAPIReader(), PDBs: mgr.GetClient(), Settings: *opts.Drain, Wait: opts.WarningsWait, Clock: clock.RealClock{}}, nil
}

// registerEviction serves the eviction webhook, with the pod locator it reads.
func registerEviction(mgr ctrl.Manager, opts Options, recorder events.EventRecorder) error {
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
	mgr.GetWebhookServer().Register(EvictionPath, &webhook.Admission{Handler: &EvictionHandler{
		Pods: pods, Nodes: mgr.GetClient(), Reader: mgr.GetAPIReader(), Client: mgr.GetClient(),
		Rule:    opts.Rules.Drain,
		Managed: opts.Managed, Signals: opts.Signals, Traffic: opts.Traffic,
		Self:     selfUsername(cs),
		Recorder: recorder, Clock: clock.RealClock{}, Timeout: evictionTimeout(opts.DeleteTimeout),
	}})
	return nil
}

// selfUsername asks the API server who nodeguard is (a SelfSubjectReview,
// which every authenticated user may create), so that the eviction webhook
// knows its own drains' evictions. "" when it cannot tell: they are then held
// like anyone's until the node's TrafficCut condition is written.
func selfUsername(cs kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		ctrl.Log.WithName("webhook").Error(err, "Asking the API server who nodeguard is; its own evictions from deleted nodes may wait for their TrafficCut condition")
		return ""
	}
	return review.Status.UserInfo.Username
}

// evictionTimeout is the eviction decision's time budget: the admission
// decisions' (--delete-admission-timeout, which the Helm chart sets 1 s below
// the webhooks' timeoutSeconds, the eviction webhook's included), so that
// nodeguard answers before kube-apiserver gives up and its failurePolicy
// Ignore admits an eviction nodeguard would refuse.
func evictionTimeout(decision time.Duration) time.Duration {
	if decision > 0 {
		return decision
	}
	return DefaultEvictionTimeout
}
