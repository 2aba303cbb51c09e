package azure

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// AdminState is a backend entry's administrative state as nodeguard sets it.
type AdminState string

const (
	// AdminStateNone lets health probes decide (the normal state).
	AdminStateNone AdminState = "None"
	// AdminStateDown stops new connections to the node.
	AdminStateDown AdminState = "Down"
)

// SignalAdminState says who sets admin state for the signal taints
// (--signal-admin-state).
type SignalAdminState string

const (
	// SignalByNodeguard: nodeguard sets Down for the signal taints too.
	SignalByNodeguard SignalAdminState = "nodeguard"
	// SignalByCloudProvider: the cloud provider (cloud-provider-azure with
	// admin state) sets Down for the signal taints; nodeguard keeps only the
	// cut of the nodes it drains.
	SignalByCloudProvider SignalAdminState = "cloud-provider"
)

// Signals says how signal taints set a node's admin state: which taints are
// signals (Table, --signal-taints; nil: the defaults) and who acts on them
// (Mode, --signal-admin-state; "": nodeguard). main builds it once.
type Signals struct {
	Table *ngv1alpha1.Signals
	Mode  SignalAdminState
}

// ByNodeguard reports whether nodeguard sets Down for the signal taints
// (--signal-admin-state=nodeguard).
func (s Signals) ByNodeguard() bool { return s.Mode != SignalByCloudProvider }

// ConfirmationPoll is how often a pass that waits for Azure to confirm a
// node's admin state, and cannot block in WaitConfirmed, looks again.
const ConfirmationPoll = time.Second

// ParseSignalAdminState parses --signal-admin-state.
func ParseSignalAdminState(s string) (SignalAdminState, error) {
	switch m := SignalAdminState(s); m {
	case SignalByNodeguard, SignalByCloudProvider:
		return m, nil
	}
	return "", fmt.Errorf("%q: must be %q or %q", s, SignalByNodeguard, SignalByCloudProvider)
}

// DesiredState is the one place that decides a node's admin state: Down while
// it carries nodeguard's draining taint or is being deleted while nodeguard's
// finalizer holds it or someone else's drain of it was charged
// (ngv1alpha1.DrainCharged), and (with --signal-admin-state=nodeguard) while it
// carries a configured signal taint (--signal-taints: by default
// out-of-service, cloud shutdown, spot eviction, cluster-autoscaler's and
// Karpenter's scale-down taints); None otherwise. None is not restored while
// Table.HoldsAdminState: that is the caller's rule.
func (s Signals) DesiredState(node *corev1.Node) AdminState {
	if node == nil {
		return AdminStateNone
	}
	for _, t := range node.Spec.Taints {
		if ngv1alpha1.IsDrainingTaint(t) {
			return AdminStateDown
		}
		if _, signal := s.Table.Of(t); signal && s.ByNodeguard() {
			return AdminStateDown
		}
	}
	if ngv1alpha1.TerminatingUnderFinalizer(node) {
		return AdminStateDown
	}
	if _, charged := ngv1alpha1.DrainCharged(node); charged {
		return AdminStateDown
	}
	return AdminStateNone
}
