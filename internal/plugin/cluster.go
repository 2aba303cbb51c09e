package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
)

// Cluster is what the commands read.
type Cluster struct {
	Client client.Reader
	// Settings are nodeguard's drain settings (see ReadSettings).
	Settings foresight.Settings
	Now      func() time.Time
}

// ReadSettings reads --blocked-pdb-policy, --drain-timeout and
// --daemonset-pods from the args of nodeguard's Deployment in namespace;
// nodeguard's defaults for those it does not set, or when the Deployment
// cannot be read (source says which).
func ReadSettings(ctx context.Context, c client.Reader, namespace string) (s foresight.Settings, source string) {
	s = foresight.Settings{BlockedPDBPolicy: drain.BlockedPDBWait, DaemonSets: drain.DaemonSetsLast}
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "nodeguard"}, &d); err != nil {
		return s, fmt.Sprintf("nodeguard's defaults (Deployment %s/nodeguard: %v)", namespace, reason(err))
	}
	for _, ctr := range d.Spec.Template.Spec.Containers {
		for _, arg := range ctr.Args {
			name, value, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
			switch name {
			case "blocked-pdb-policy":
				if p, err := drain.ParseBlockedPDBPolicy(value); err == nil {
					s.BlockedPDBPolicy = p
				}
			case "drain-timeout":
				if t, err := time.ParseDuration(value); err == nil {
					s.DrainTimeout = t
				}
			case "daemonset-pods":
				s.DaemonSets = drain.DaemonSetPolicy(value)
			}
		}
	}
	return s, fmt.Sprintf("Deployment %s/nodeguard", namespace)
}

func reason(err error) string {
	if apierrors.IsNotFound(err) {
		return "not found"
	}
	if apierrors.IsForbidden(err) {
		return "forbidden"
	}
	return err.Error()
}

// node reads one node.
func (c *Cluster) node(ctx context.Context, name string) (*corev1.Node, error) {
	var n corev1.Node
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return nil, fmt.Errorf("reading node %s: %w", name, err)
	}
	return &n, nil
}

// budgets lists the NodeDisruptionBudgets, by name.
func (c *Cluster) budgets(ctx context.Context) ([]ngv1alpha1.NodeDisruptionBudget, error) {
	var list ngv1alpha1.NodeDisruptionBudgetList
	if err := c.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NodeDisruptionBudgets: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b ngv1alpha1.NodeDisruptionBudget) int { return strings.Compare(a.Name, b.Name) })
	return list.Items, nil
}

// selecting are the budgets that select node.
func selecting(ndbs []ngv1alpha1.NodeDisruptionBudget, node *corev1.Node) []*ngv1alpha1.NodeDisruptionBudget {
	var out []*ngv1alpha1.NodeDisruptionBudget
	for i := range ndbs {
		if ok, err := budget.Selects(&ndbs[i], node); ok && err == nil {
			out = append(out, &ndbs[i])
		}
	}
	return out
}

// DrainDeadline is a node's drain deadline (drain.Timeout): how long after
// its deletion the drain stops waiting for pods that do not go by themselves.
type DrainDeadline struct {
	// Timeout is 0 when there is none.
	Timeout time.Duration `json:"timeoutNanoseconds"`
	// From names what sets it: --drain-timeout, the node's annotation, or a
	// NodeDisruptionBudget's drainTimeout.
	From string `json:"from"`
	// At is when it passes, for a node being deleted.
	At *time.Time `json:"at,omitempty"`
}

// deadline reads the node's drain deadline as the drain does: the shortest
// of its own and its budgets' (ndbs: all of them).
func (c *Cluster) deadline(node *corev1.Node, ndbs []ngv1alpha1.NodeDisruptionBudget) DrainDeadline {
	timeout, from, _ := drain.Timeout(node, c.Settings.DrainTimeout, ndbs) // a bad annotation is a finding of its own
	d := DrainDeadline{Timeout: timeout, From: from}
	if timeout > 0 && node.DeletionTimestamp != nil {
		at := node.DeletionTimestamp.Add(timeout)
		d.At = &at
	}
	return d
}

// String says it in a few words: "30m0s after the deletion (--drain-timeout)".
func (d DrainDeadline) String() string {
	if d.Timeout <= 0 {
		return fmt.Sprintf("none (%s 0, and no NodeDisruptionBudget of the node sets a drainTimeout)", d.From)
	}
	s := fmt.Sprintf("%s after the deletion (%s)", d.Timeout, d.From)
	if d.At != nil {
		s = fmt.Sprintf("%s, %s", d.At.UTC().Format(time.RFC3339), s)
	}
	return s
}

// foresee reads what the node's drain meets, as nodeguard's admission
// warnings do; ndbs are the NodeDisruptionBudgets, whose drainTimeout may
// bring the deadline closer.
func (c *Cluster) foresee(ctx context.Context, node *corev1.Node, pdbs []policyv1.PodDisruptionBudget, ndbs []ngv1alpha1.NodeDisruptionBudget) ([]foresight.Finding, []*drain.Plan, error) {
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return nil, nil, fmt.Errorf("listing the pods of node %s: %w", node.Name, err)
	}
	plans, err := foresight.Plans(pods.Items, pdbs, c.Settings, c.Now())
	if err != nil {
		return nil, nil, err
	}
	return foresight.FromPlans(ctx, node, plans, ndbs, c.Settings, foresight.DeploymentsFrom(c.Client)), plans, nil
}

func (c *Cluster) pdbs(ctx context.Context) ([]policyv1.PodDisruptionBudget, error) {
	var list policyv1.PodDisruptionBudgetList
	if err := c.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing PodDisruptionBudgets: %w", err)
	}
	return list.Items, nil
}

// maintenanceHold is the node's maintenance Lease's hold by someone other
// than nodeguard, if any.
func (c *Cluster) maintenanceHold(ctx context.Context, node string) (*budget.Hold, error) {
	var lease coordinationv1.Lease
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: node}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the maintenance Lease of node %s: %w", node, err)
	}
	return budget.HeldByOther(&lease, c.Now()), nil
}

// chargedBy says who a budget's disruption of node is for, from the marks
// nodeguard leaves on the node.
func chargedBy(node *corev1.Node) string {
	switch {
	case node == nil:
		return "a node that is gone"
	case node.DeletionTimestamp != nil:
		return "its deletion"
	case node.Annotations[ngv1alpha1.NodeClaimDeleteChargedAtAnnotation] != "":
		return "Karpenter's NodeClaim delete"
	case ngv1alpha1.ScaleDownClaimed(node):
		return "cluster-autoscaler's scale-down"
	}
	if by, ok := ngv1alpha1.DrainCharged(node); ok {
		return "a drain by " + by
	}
	return "an admission not yet seen on the node"
}
