package taintwatch

import (
	"flag"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure"
)

// Options are the taint watcher's flags.
type Options struct {
	// SpotEvents turns PreemptScheduled node events into the spot-eviction
	// taint.
	SpotEvents bool
	// Signals are the configured signal taints and who acts on them (main
	// sets them from --signal-taints and --signal-admin-state).
	Signals azure.Signals
}

// NewOptions returns the defaults.
func NewOptions() Options { return Options{SpotEvents: true} }

// BindFlags registers the flags on fs. Set defaults first (NewOptions).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.SpotEvents, "spot-eviction-events", o.SpotEvents,
		"Add the taint cloudprovider.azure.microsoft.com/draining=spot-eviction:NoSchedule to a node when the first "+
			"PreemptScheduled event about it appears (the taint then cuts its load-balancer traffic and counts it unavailable "+
			"for NodeDisruptionBudgets). Only those events are watched (field selector reason=PreemptScheduled,involvedObject.kind=Node). "+
			"Runs with or without Azure configuration.")
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Setup adds the taint watcher and, with opts.SpotEvents, the spot-eviction
// tainter to mgr. Both run on the leader only. adminState may be nil (no
// Azure configuration): the watcher then only keeps the signal gauges. The
// periodic re-application of desired state is the admin-state manager's
// resync (--azure-admin-state-resync); on start the watcher sees every node
// and sets its desired state again.
func Setup(mgr ctrl.Manager, adminState *azure.Manager, opts Options) error {
	w := &Watcher{Client: mgr.GetClient(), AdminState: adminState, Recorder: mgr.GetEventRecorder("nodeguard-signal"), Signals: opts.Signals}
	if err := w.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the taint watcher: %w", err)
	}
	if adminState != nil && adminState.Verifying() { // its cache of Services costs memory
		if err := (&serviceWatcher{adminState: adminState}).setup(mgr); err != nil {
			return err
		}
	}
	if !opts.SpotEvents {
		return nil
	}
	events, err := NewEventCache(mgr)
	if err != nil {
		return err
	}
	if err := mgr.Add(events); err != nil {
		return fmt.Errorf("adding the PreemptScheduled event cache: %w", err)
	}
	s := &SpotTainter{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("nodeguard-signal")}
	if err := s.SetupWithManager(mgr, events); err != nil {
		return fmt.Errorf("setting up the spot-eviction tainter: %w", err)
	}
	return nil
}
