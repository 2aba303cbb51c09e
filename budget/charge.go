package budget

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Matching returns the budgets selecting the node, sorted by name. An
// invalid selector selects nothing, as for PodDisruptionBudgets. For a
// decision, reader must read consistently from kube-apiserver (Rule.Budgets):
// an informer may not have seen a budget created or re-selected just now.
func Matching(ctx context.Context, reader client.Reader, node *corev1.Node) ([]*ngv1alpha1.NodeDisruptionBudget, error) {
	var list ngv1alpha1.NodeDisruptionBudgetList
	if err := reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing NodeDisruptionBudgets: %w", err)
	}
	var out []*ngv1alpha1.NodeDisruptionBudget
	for i := range list.Items {
		if selects, err := Selects(&list.Items[i], node); err == nil && selects {
			out = append(out, &list.Items[i])
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Charged is one budget's charge made by one decision: the entry it wrote,
// which only that decision may give back.
type Charged struct {
	Budget *ngv1alpha1.NodeDisruptionBudget
	Stamp  metav1.Time
}

// Charge is the outcome of charging one disruption of a node to several
// budgets.
type Charge struct {
	// Newly are the charges this call made (not those made before).
	Newly []Charged
	// Denial, when set, is the refusal of Denier; nothing this call charged
	// stays charged.
	Denial *Denial
	Denier *ngv1alpha1.NodeDisruptionBudget
}

// ChargeAll charges the node's disruption to every budget in order, as a
// Node DELETE does; when one denies, it gives back what it charged before.
// An error other than a denial is returned as such (also after giving back).
func (c *Claimer) ChargeAll(ctx context.Context, budgets []*ngv1alpha1.NodeDisruptionBudget, node *corev1.Node, dryRun bool) (Charge, error) {
	var ch Charge
	for _, b := range budgets {
		stamp, err := c.claim(ctx, b.Name, node, dryRun)
		if err != nil {
			releaseErr := c.GiveBack(ctx, ch.Newly, node.Name)
			ch.Newly = nil
			var denial *Denial
			if errors.As(err, &denial) {
				ch.Denial, ch.Denier = denial, b
				return ch, releaseErr
			}
			return ch, errors.Join(err, releaseErr)
		}
		if !stamp.IsZero() {
			ch.Newly = append(ch.Newly, Charged{Budget: b, Stamp: stamp})
		}
	}
	return ch, nil
}

// GiveBack releases charges a decision made, each only while its entry is
// still the one that decision wrote.
func (c *Claimer) GiveBack(ctx context.Context, charged []Charged, node string) error {
	var errs []error
	for _, ch := range charged {
		errs = append(errs, c.release(ctx, ch.Budget.Name, node, ch.Stamp))
	}
	return errors.Join(errs...)
}

// ReleaseAll gives back the node's charge to each budget, whoever made it
// (one that does not charge it is left as it is).
func (c *Claimer) ReleaseAll(ctx context.Context, budgets []*ngv1alpha1.NodeDisruptionBudget, node string) error {
	var errs []error
	for _, b := range budgets {
		errs = append(errs, c.Release(ctx, b.Name, node))
	}
	return errors.Join(errs...)
}
