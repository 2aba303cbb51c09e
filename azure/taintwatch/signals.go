package taintwatch

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/azure/backends"
)

// Signal names (values of the metric label "signal"): the configured signal
// taints' (api/v1alpha1.SignalTaints, from --signal-taints), then nodeguard's
// own three.
const (
	signalDraining = "draining"
	signalDeleting = "deleting"
	// signalDrained: someone else's drain was charged (nodeguard.io/drain-charged-at).
	signalDrained = "drained"
)

func allSignals(signals *ngv1alpha1.Signals) []string {
	var out []string
	for _, s := range signals.Taints() {
		out = append(out, s.Signal)
	}
	return append(out, signalDraining, signalDeleting, signalDrained)
}

// signalsOf lists the signals a node carries, in allSignals order. It only
// describes them (for gauges, events and change detection): whether a node is
// Down is decided by azure.Signals.DesiredState alone.
func signalsOf(n *corev1.Node, signals *ngv1alpha1.Signals) []string {
	has := map[string]bool{}
	for _, t := range n.Spec.Taints {
		if s, ok := signals.Of(t); ok {
			has[s.Signal] = true
		}
		if ngv1alpha1.IsDrainingTaint(t) {
			has[signalDraining] = true
		}
	}
	if ngv1alpha1.TerminatingUnderFinalizer(n) {
		has[signalDeleting] = true
	}
	if _, charged := ngv1alpha1.DrainCharged(n); charged {
		has[signalDrained] = true
	}
	var out []string
	for _, s := range allSignals(signals) {
		if has[s] {
			out = append(out, s)
		}
	}
	return out
}

// heldDown reports whether nodeguard recorded taking the node's entries Down.
func heldDown(n *corev1.Node) bool {
	_, ok := n.Annotations[ngv1alpha1.AdminStateDownAnnotation]
	return ok
}

// inputs is everything the watcher's decision depends on. An update that
// leaves it unchanged (a heartbeat, a label, a cordon) is not reconciled.
type inputs struct {
	desired  azure.AdminState
	signals  string
	held     bool
	deleting bool
	// holds: a signal taint either nodeguard or the cloud provider honours.
	holds bool
	// ident finds the node's backend entries (name, providerID, InternalIPs).
	ident string
}

func inputsOf(n *corev1.Node, signals azure.Signals) inputs {
	id := backends.FromNode(n)
	ips := make([]string, 0, len(id.IPs))
	for _, ip := range id.IPs {
		ips = append(ips, ip.String())
	}
	return inputs{
		desired:  signals.DesiredState(n),
		signals:  strings.Join(signalsOf(n, signals.Table), ","),
		held:     heldDown(n),
		deleting: n.DeletionTimestamp != nil,
		holds:    signals.Table.HoldsAdminState(n),
		ident:    id.ProviderID + "|" + strings.Join(ips, ","),
	}
}
