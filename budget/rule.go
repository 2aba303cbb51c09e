package budget

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Why a Verdict decided as it did (also the doors' metric label values).
const (
	WhyBudget          = "budget"
	WhyMaintenanceHold = "maintenance_hold"
	WhyInstanceGone    = "instance_gone"
	WhyUnavailableNode = "unavailable_node"
)

// InstanceChecker says whether a node's cloud instance still exists (on
// Azure: the VM named by its providerID). cmd/nodeguard passes the Azure
// admin-state manager; without Azure there is none.
type InstanceChecker interface {
	InstanceExists(ctx context.Context, node *corev1.Node) (bool, error)
}

// Rule decides whether a node may be disrupted now. It is the one rule every
// door that starts a disruption calls (a Node DELETE, a Karpenter NodeClaim
// DELETE, a cluster-autoscaler scale-down, the first eviction of someone
// else's drain), and the only code that charges
// NodeDisruptionBudgets for a disruption and gives a refused one back.
// nodeguard builds its two rules once, with NewRules; the order of the checks
// lives here only (Decide, DecideBeforeBudgets).
type Rule struct {
	Claimer *Claimer
	// Budgets lists the NodeDisruptionBudgets that select the node. It must
	// read consistently from kube-apiserver (a List with no resourceVersion,
	// such as the manager's API reader), never from an informer: a budget
	// created or re-selected a moment before the request is not yet in a
	// lagging replica's cache, and a set listed from it would leave that
	// budget out of the decision. (Each charge re-reads its budget fresh by
	// itself; this is the set of budgets charged.) NewRule sets the
	// Claimer's Reader.
	Budgets client.Reader
	// Leases reads maintenance Leases fresh from the API server; nil reads
	// none: the door's disruption is not refused for a hold (the eviction
	// door: a Lease holder that drains its node is the drainer).
	Leases client.Reader
	// Instances, when set, says whether a NotReady node's instance is gone.
	Instances InstanceChecker
	Clock     clock.PassiveClock
}

// NewRule returns the rule a door applies: it lists the budgets selecting a
// node through the claimer's Reader, which reads fresh from kube-apiserver
// (NewClaimer: the manager's API reader), as the Eviction API reads
// PodDisruptionBudgets from storage. kube-apiserver 1.34+ serves such a List
// from its watch cache once that has caught up with etcd's revision
// (ConsistentListFromCache): no etcd range read, but after writes to other
// resources a wait of up to 100 ms for the cache's progress notification
// (docs/performance.md). leases reads maintenance Leases fresh (nil: no hold
// refuses the door's disruption); instances may be nil.
func NewRule(claimer *Claimer, leases client.Reader, instances InstanceChecker, clk clock.PassiveClock) *Rule {
	return &Rule{Claimer: claimer, Budgets: claimer.Reader, Leases: leases, Instances: instances, Clock: clk}
}

// Rules are the two rules nodeguard's doors apply, built once at start-up
// (NewRules) and shared by every door: a Rule keeps no state of its own.
type Rules struct {
	// Deletion decides the doors that delete a node: a Node DELETE, a
	// Karpenter NodeClaim DELETE, a cluster-autoscaler scale-down. A
	// maintenance Lease someone else holds refuses them.
	Deletion *Rule
	// Drain decides someone else's drain (the eviction webhook, the drains
	// the termination controller finds under way). It reads no Lease: whoever
	// holds the node's Lease and drains it is the drainer.
	Drain *Rule
}

// NewRules builds both rules over one claimer, so that every budget write
// joins its group commit; leases reads maintenance Leases fresh for the
// deletion rule, instances (nil: no cloud) serves both.
func NewRules(claimer *Claimer, leases client.Reader, instances InstanceChecker, clk clock.PassiveClock) Rules {
	return Rules{
		Deletion: NewRule(claimer, leases, instances, clk),
		Drain:    NewRule(claimer, nil, instances, clk),
	}
}

// Verdict is the rule's answer for one node.
type Verdict struct {
	Allowed bool
	// Code, for a refusal: 429 for "not now", 403 for "never".
	Code int32
	// Why is "" for an ordinary admission within the budgets, or one of the
	// Why* values.
	Why string
	// Message says why, without the door's own words ("deleting node X").
	Message string
	// Charged are the charges this decision made: none on a dry run and on
	// a refusal.
	Charged []Charged
	// Denier is the budget that refused, if one did.
	Denier *ngv1alpha1.NodeDisruptionBudget
}

// Decide judges a disruption of node: allowed when its instance is gone;
// refused while someone other than nodeguard holds its maintenance Lease;
// otherwise allowed only within every NodeDisruptionBudget selecting it, each
// of which it charges. A dry run decides the same from the same reads and
// writes nothing. A refusal leaves nothing charged by this decision. An error
// is a read or write that failed (never a refusal).
//
// The Lease is read while the budgets are charged, not before: read first,
// it would add an API round trip to every guarded disruption. A hold still
// wins, and the charges are given back; the overlap leaves a charge that
// lives for one round trip, which a concurrent request meets as "retry",
// never as room beyond the budget.
func (r *Rule) Decide(ctx context.Context, node *corev1.Node, dryRun bool) (Verdict, error) {
	if v, gone := r.gone(ctx, node); gone {
		return v, nil
	}
	type hold struct {
		v    Verdict
		held bool
		err  error
	}
	holds := make(chan hold, 1)
	go func() {
		v, held, err := r.held(ctx, node)
		holds <- hold{v, held, err}
	}()
	v, err := r.charge(ctx, node, dryRun)
	if h := <-holds; h.held || h.err != nil {
		if err == nil {
			r.giveBack(ctx, node.Name, v.Charged)
		}
		return h.v, h.err
	}
	return v, err
}

// DecideBeforeBudgets applies the checks Decide makes before the budgets, in
// its order, and charges nothing: a gone instance is let go, a maintenance
// hold refuses. decided is false when neither applies: the budgets would
// decide. (The Node DELETE door asks it of a node it first guards with its
// finalizer: the delete is refused to be retried, unless one of these
// decides it.)
func (r *Rule) DecideBeforeBudgets(ctx context.Context, node *corev1.Node) (v Verdict, decided bool, err error) {
	if v, gone := r.gone(ctx, node); gone {
		return v, true, nil
	}
	return r.held(ctx, node)
}

// held reports whether someone other than nodeguard holds the node's
// maintenance Lease, with the refusal that says so.
func (r *Rule) held(ctx context.Context, node *corev1.Node) (Verdict, bool, error) {
	if r.Leases == nil {
		return Verdict{}, false, nil
	}
	var lease coordinationv1.Lease
	err := r.Leases.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node.Name}, &lease)
	if client.IgnoreNotFound(err) != nil {
		return Verdict{}, false, fmt.Errorf("reading maintenance Lease of node %s: %w", node.Name, err)
	}
	if err != nil {
		return Verdict{}, false, nil // no Lease: no hold
	}
	hold := HeldByOther(&lease, r.Clock.Now())
	if hold == nil {
		return Verdict{}, false, nil
	}
	return Verdict{Code: http.StatusTooManyRequests, Why: WhyMaintenanceHold, Message: fmt.Sprintf(
		"node %s is under maintenance: its Lease %s/%s is %s; retry after the holder releases it",
		node.Name, ngv1alpha1.MaintenanceLeaseNamespace, node.Name, hold)}, true, nil
}

// charge charges one disruption to every budget selecting the node, in name
// order; when one refuses, it gives back what it charged before.
func (r *Rule) charge(ctx context.Context, node *corev1.Node, dryRun bool) (Verdict, error) {
	budgets, err := Matching(ctx, r.Budgets, node)
	if err != nil {
		return Verdict{}, err
	}
	ch, err := r.Claimer.ChargeAll(ctx, budgets, node, dryRun)
	if ch.Denial != nil {
		if err != nil {
			// The refusal stands; the status controller gives back what
			// could not be, after the claim timeout.
			logf.FromContext(ctx).Error(err, "Giving back a refused disruption's charges", "node", node.Name)
		}
		return Verdict{Code: ch.Denial.Code, Why: WhyBudget, Denier: ch.Denier, Message: ch.Denial.Message}, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	names := make([]string, 0, len(budgets))
	for _, b := range budgets {
		names = append(names, b.Name)
	}
	v := Verdict{Allowed: true, Charged: ch.Newly, Message: fmt.Sprintf("within %d NodeDisruptionBudget(s)", len(names))}
	if len(names) > 0 {
		v.Message += ": " + strings.Join(names, ", ")
	}
	if unavailable, why := Unavailable(node, r.Claimer.Signals); unavailable && len(names) > 0 {
		// Nothing was charged: the budgets count this node unavailable
		// already (their unhealthyNodeDeletionPolicy let it go).
		v.Why = WhyUnavailableNode
		v.Message = fmt.Sprintf("node %s is already unavailable (%s): its deletion consumes no disruption of %s",
			node.Name, why, strings.Join(names, ", "))
	}
	return v, nil
}

// giveBack releases the charges of a disruption that a hold refused after
// they were made.
func (r *Rule) giveBack(ctx context.Context, node string, charged []Charged) {
	if err := r.Claimer.GiveBack(ctx, charged, node); err != nil {
		// The status controller gives the claim back after the claim timeout.
		logf.FromContext(ctx).Error(err, "Giving back the charges of a disruption refused by a maintenance hold", "node", node)
	}
}

// gone reports whether a node that is not Ready has no instance any more,
// with the admission that says so: the cloud node lifecycle controller
// deletes exactly such nodes, every 5 s, and must never be refused (the node
// has nothing left to protect, and the pod garbage collector waits for it to
// go). A node that is Ready is not asked about; an error counts as "exists"
// (the usual rules apply).
func (r *Rule) gone(ctx context.Context, node *corev1.Node) (Verdict, bool) {
	if r.Instances == nil || ngv1alpha1.Ready(node) {
		return Verdict{}, false
	}
	exists, err := r.Instances.InstanceExists(ctx, node)
	if err != nil {
		logf.FromContext(ctx).Error(err, "Asking whether the node's instance exists; deciding as if it does", "node", node.Name)
		return Verdict{}, false
	}
	if exists {
		return Verdict{}, false
	}
	return Verdict{Allowed: true, Why: WhyInstanceGone, Message: fmt.Sprintf(
		"node %s is not Ready and its instance %s no longer exists: nothing is left to protect", node.Name, node.Spec.ProviderID)}, true
}
