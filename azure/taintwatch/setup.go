package taintwatch

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/nodeguard/nodeguard/azure"
)

// Options are the taint watcher's flags.
type Options struct {
	// SpotEvents turns PreemptScheduled node events into the spot-eviction
	// taint.
	SpotEvents bool
	// SpotEventNamespace and SpotEventComponents (comma-separated; empty:
	// any) say which PreemptScheduled events are Azure's notices: where and
	// by whom AKS writes them.
	SpotEventNamespace  string
	SpotEventComponents string
	// SpotNoticeExpiry: a node still running this long after a notice has
	// the taint nodeguard added removed again; 0 never.
	SpotNoticeExpiry time.Duration
	// Managed selects the nodes the spot tainter may taint (main sets it
	// from --node-selector); nil: every node.
	Managed labels.Selector
	// Signals are the configured signal taints and who acts on them (main
	// sets them from --signal-taints and --signal-admin-state).
	Signals azure.Signals
	// Clock is the spot tainter's clock; nil: the real one (tests set it).
	Clock clock.Clock
}

// DefaultSpotNoticeExpiry is --spot-eviction-notice-expiry's default.
// Azure evicts a spot VM 30 s after its notice; a kubelet posts its status at
// least every 5 minutes.
const DefaultSpotNoticeExpiry = 5 * time.Minute

// minSpotNoticeExpiry is the shortest expiry: past Azure's 30 s, with room
// for the up to 25 s node-problem-detector may take to report the notice
// (its plugin's timeout) and for clock skew between kubelet and API server.
const minSpotNoticeExpiry = time.Minute

// NewOptions returns the defaults.
func NewOptions() Options {
	return Options{SpotEvents: true, SpotEventNamespace: DefaultSpotEventNamespace,
		SpotEventComponents: DefaultSpotEventComponent, SpotNoticeExpiry: DefaultSpotNoticeExpiry}
}

// BindFlags registers the flags on fs. Set defaults first (NewOptions).
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.SpotEvents, "spot-eviction-events", o.SpotEvents,
		"Add the taint cloudprovider.azure.microsoft.com/draining=spot-eviction:NoSchedule to a node when the first trusted "+
			"PreemptScheduled notice about it appears (the taint then cuts its load-balancer traffic and counts it unavailable "+
			"for NodeDisruptionBudgets): an event in --spot-eviction-event-namespace by a --spot-eviction-event-components writer on that very node, "+
			"about a spot node (label "+spotLabel+") that --node-selector selects. Only PreemptScheduled events about Nodes in that namespace "+
			"are watched (field selector reason=PreemptScheduled,involvedObject.kind=Node). Runs with or without Azure configuration.")
	fs.StringVar(&o.SpotEventNamespace, "spot-eviction-event-namespace", o.SpotEventNamespace,
		"Namespace of the PreemptScheduled events trusted as Azure spot-eviction notices: AKS's node-problem-detector writes them in 'default'. "+
			"Events in other namespaces are not read, so a tenant who may create Events in its own namespace cannot taint a node; "+
			"whoever may create Events in this one can (keep that to cluster administrators and nodes).")
	fs.StringVar(&o.SpotEventComponents, "spot-eviction-event-components", o.SpotEventComponents,
		"Writers of trusted PreemptScheduled events, comma-separated: the event's reportingController (else source.component), "+
			"AKS's node-problem-detector monitor by default. The event's reportingInstance (else source.host) must also be the node's name, "+
			"as node-problem-detector, which runs on the node, writes it. Empty: any writer in --spot-eviction-event-namespace.")
	fs.DurationVar(&o.SpotNoticeExpiry, "spot-eviction-notice-expiry", o.SpotNoticeExpiry,
		"Remove the spot-eviction taint nodeguard added when the node is still Ready, with a kubelet status posted this long after the "+
			"PreemptScheduled notice or later (Warning event "+ReasonSpotEvictionNoticeExpired+"): Azure evicts a spot VM 30 s after its notice, "+
			"so such a notice was false. A taint someone else added is never removed. 0 never removes; otherwise at least 1m.")
}

// Validate checks the spot flags.
func (o *Options) Validate() error {
	if errs := validation.IsDNS1123Label(o.SpotEventNamespace); len(errs) > 0 {
		return fmt.Errorf("--spot-eviction-event-namespace %q must name one namespace: %s", o.SpotEventNamespace, strings.Join(errs, "; "))
	}
	if e := o.SpotNoticeExpiry; e < 0 || (e > 0 && e < minSpotNoticeExpiry) {
		return fmt.Errorf("--spot-eviction-notice-expiry (%s) must be 0 (never) or at least %s", e, minSpotNoticeExpiry)
	}
	return nil
}

// spotWriter is who writes trusted notices, from the options.
func (o *Options) spotWriter() noticeWriter {
	w := noticeWriter{namespace: o.SpotEventNamespace}
	for _, c := range strings.Split(o.SpotEventComponents, ",") {
		if c = strings.TrimSpace(c); c != "" {
			w.components = append(w.components, c)
		}
	}
	return w
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
	if err := opts.Validate(); err != nil {
		return err
	}
	events, err := NewEventCache(mgr, opts.SpotEventNamespace)
	if err != nil {
		return err
	}
	if err := mgr.Add(events); err != nil {
		return fmt.Errorf("adding the PreemptScheduled event cache: %w", err)
	}
	s := &SpotTainter{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("nodeguard-signal"), Clock: opts.Clock,
		Writer: opts.spotWriter(), Managed: opts.Managed, Expiry: opts.SpotNoticeExpiry}
	if err := s.SetupWithManager(mgr, events); err != nil {
		return fmt.Errorf("setting up the spot-eviction tainter: %w", err)
	}
	return nil
}
