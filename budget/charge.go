package budget

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Matching returns the budgets selecting the node, sorted by name. An
// invalid selector selects nothing, as for PodDisruptionBudgets.
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

// Charge is the outcome of charging one disruption of a node to several
// budgets.
type Charge struct {
	// Newly are the budgets this call charged (not those charged before).
	Newly []*ngv1alpha1.NodeDisruptionBudget
	// Denial, when set, is the refusal of Denier; nothing stays charged.
	Denial *Denial
	Denier *ngv1alpha1.NodeDisruptionBudget
}

// ChargeAll charges the node's disruption to every budget in order, as a
// Node DELETE does; when one denies, it gives back what it charged before.
// An error other than a denial is returned as such (also after giving back).
func (c *Claimer) ChargeAll(ctx context.Context, budgets []*ngv1alpha1.NodeDisruptionBudget, node *corev1.Node, dryRun bool) (Charge, error) {
	var ch Charge
	for _, b := range budgets {
		newly, err := c.Claim(ctx, b.Name, node, dryRun)
		if err != nil {
			releaseErr := c.ReleaseAll(ctx, ch.Newly, node.Name)
			ch.Newly = nil
			var denial *Denial
			if errors.As(err, &denial) {
				ch.Denial, ch.Denier = denial, b
				return ch, releaseErr
			}
			return ch, errors.Join(err, releaseErr)
		}
		if newly && !dryRun {
			ch.Newly = append(ch.Newly, b)
		}
	}
	return ch, nil
}

// ReleaseAll gives back the node's charge to each budget (one that does not
// charge it is left as it is).
func (c *Claimer) ReleaseAll(ctx context.Context, budgets []*ngv1alpha1.NodeDisruptionBudget, node string) error {
	var errs []error
	for _, b := range budgets {
		errs = append(errs, c.Release(ctx, b.Name, node))
	}
	return errors.Join(errs...)
}
