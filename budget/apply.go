package budget

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// apply applies the changes in order to a copy of base at now: a claim is
// charged if the budget, with the changes before it, allows one more
// disruption; a release gives its node back. It returns the changed copy, one
// verdict per change, and whether anything changed.
func (c *Claimer) apply(base *ngv1alpha1.NodeDisruptionBudget, changes []change, now time.Time) (*ngv1alpha1.NodeDisruptionBudget, []verdict, bool) {
	ndb := base.DeepCopy()
	vs := make([]verdict, len(changes))
	changed, counted := false, false
	for i, ch := range changes {
		at, charged := ndb.Status.DisruptedNodes[ch.node]
		switch {
		case ch.recompute != nil:
			if ch.recompute(ndb) {
				changed = true // it set the condition itself
			}
		case ch.release && charged && (ch.stamp.IsZero() || ch.stamp.Equal(&at)):
			delete(ndb.Status.DisruptedNodes, ch.node)
			ndb.Status.CurrentAvailable++
			if n, err := FromStatus(ndb, now); err == nil {
				ndb.Status.DisruptionsAllowed = n.Allowed
			}
			changed, counted = true, true
		case ch.release:
			// nothing to give back, or the entry is another request's claim
		case charged:
			// Claims are idempotent. A claim still in flight may be given
			// back by the request that made it; stamping the entry anew
			// makes it this request's too, so that release misses it.
			if now.Sub(at.Time) < claimInFlight && !at.After(now) {
				ndb.Status.DisruptedNodes[ch.node] = restamp(at)
				changed = true
			}
		default:
			n, err := c.check(ndb, now)
			if err != nil {
				vs[i].err = err
				continue
			}
			if ndb.Status.DisruptedNodes == nil {
				ndb.Status.DisruptedNodes = map[string]metav1.Time{}
			}
			vs[i].stamp = metav1.NewTime(now.Truncate(time.Second))
			ndb.Status.DisruptedNodes[ch.node] = vs[i].stamp
			ndb.Status.CurrentAvailable = max(n.Available-1, 0)
			ndb.Status.DisruptionsAllowed = n.Allowed - 1
			vs[i].charged = true
			changed, counted = true, true
		}
	}
	if counted {
		setAllowedCondition(ndb, now)
	}
	return ndb, vs, changed
}

// restamp is a new stamp for a claim's entry: one second after at, the
// API's grain, so that a stamped give-back misses it. It does not move to now:
// the stamp is also the claim's age, which the status controller's timeouts
// count, and retries that are all refused elsewhere (a full budget beside
// this one, a maintenance hold) would otherwise keep an orphaned claim alive
// as long as they come. An entry stamped ahead of now (restamped within its
// second) is not restamped again: the stamp never runs ahead of the clock by
// more than a second, however many re-claims come at once.
func restamp(at metav1.Time) metav1.Time {
	return metav1.NewTime(at.Add(time.Second))
}

// setAllowedCondition brings the DisruptionAllowed condition up to the
// changed numbers, as the status controller would: otherwise every claim's
// write would be followed by the controller's, which the next claim meets as a
// conflict.
func setAllowedCondition(ndb *ngv1alpha1.NodeDisruptionBudget, now time.Time) {
	n, err := FromStatus(ndb, now)
	cond := allowedCondition(n, err, ndb.Generation)
	cond.LastTransitionTime = metav1.NewTime(now)
	meta.SetStatusCondition(&ndb.Status.Conditions, cond)
}
