// Maintenance holds: node maintenance Leases (KEP "Node Maintenance
// Lease", provisional): a Lease named after the node in namespace
// kube-node-maintenance says who is working on the node. A held node may not
// be disrupted now, whatever its budgets allow.

package budget

import (
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// clockSkew is the KEP's allowance added to a Lease's expiry.
const clockSkew = 3 * time.Second

// holderPrefix starts the holder identity of every nodeguard replica.
const holderPrefix = "nodeguard/"

// HolderIdentity is the holder identity nodeguard writes for a replica.
func HolderIdentity(replica string) string { return holderPrefix + replica }

// IsNodeguardHolder reports whether a holder identity is a nodeguard replica's.
func IsNodeguardHolder(holder string) bool { return strings.HasPrefix(holder, holderPrefix) }

// Hold describes who holds a node's maintenance Lease.
type Hold struct {
	Holder string
	// Until is when the hold lapses unless renewed; zero for an administrator's
	// hold, which lasts until released.
	Until time.Time
}

// HeldAt returns the Lease's hold at now, or nil when nobody holds it: no holder,
// released (leaseDurationSeconds 0), or expired (renewTime + leaseDurationSeconds
// + 3 s in the past). A holder starting with "kubeadm" holds it regardless of time.
func HeldAt(lease *coordinationv1.Lease, now time.Time) *Hold {
	if lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil
	}
	holder := *lease.Spec.HolderIdentity
	if strings.HasPrefix(holder, ngv1alpha1.AdminHolderPrefix) {
		return &Hold{Holder: holder}
	}
	if lease.Spec.LeaseDurationSeconds == nil || *lease.Spec.LeaseDurationSeconds <= 0 {
		return nil
	}
	renewed := lease.CreationTimestamp.Time
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	} else if lease.Spec.AcquireTime != nil {
		renewed = lease.Spec.AcquireTime.Time
	}
	until := renewed.Add(time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second + clockSkew)
	if !until.After(now) {
		return nil
	}
	return &Hold{Holder: holder, Until: until}
}

// HeldByOther returns the Lease's hold at now when someone other than
// nodeguard holds it (nil otherwise): a hold that stops a disruption.
func HeldByOther(lease *coordinationv1.Lease, now time.Time) *Hold {
	if hold := HeldAt(lease, now); hold != nil && !IsNodeguardHolder(hold.Holder) {
		return hold
	}
	return nil
}

// IsAdmin reports whether the hold is an administrator's (kubeadm...).
func (h *Hold) IsAdmin() bool { return h.Until.IsZero() }

// String describes the hold for messages: who, and until when.
func (h *Hold) String() string {
	if h.IsAdmin() {
		return "held by " + h.Holder + " until released"
	}
	return "held by " + h.Holder + " until " + h.Until.UTC().Format(time.RFC3339)
}
