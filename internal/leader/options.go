package leader

import (
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Options are the leader election flags.
type Options struct {
	Elect         bool
	Namespace     string
	ID            string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// BindFlags registers the leader election flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Elect, "leader-elect", true,
		"Run the controllers only on the replica holding the leader election Lease. The webhook is served by every replica.")
	fs.StringVar(&o.Namespace, "leader-election-namespace", defaultNamespace(),
		"Namespace of the leader election Lease (default: $POD_NAMESPACE, else nodeguard-system).")
	fs.StringVar(&o.ID, "leader-election-id", "nodeguard-leader",
		"Name of the leader election Lease.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", 15*time.Second,
		"How long standbys wait before taking over a Lease the leader stopped renewing. A leader that shuts down gracefully releases it at once.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before it gives up leadership and exits.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", 2*time.Second,
		"How often candidates try to acquire or renew the Lease.")
}

// defaultNamespace is where nodeguard runs: the pod's namespace when the
// Downward API provides it, otherwise nodeguard-system.
func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "nodeguard-system"
}

// Validate reports the first flag whose value cannot be used.
func (o *Options) Validate() error {
	if o.Elect && o.Namespace == "" {
		return fmt.Errorf("--leader-election-namespace must not be empty when --leader-elect is set")
	}
	if o.RenewDeadline >= o.LeaseDuration {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be shorter than --leader-elect-lease-duration (%s)", o.RenewDeadline, o.LeaseDuration)
	}
	if o.RetryPeriod >= o.RenewDeadline {
		return fmt.Errorf("--leader-elect-retry-period (%s) must be shorter than --leader-elect-renew-deadline (%s)", o.RetryPeriod, o.RenewDeadline)
	}
	return nil
}

// Lease names the leader election Lease.
func (o *Options) Lease() types.NamespacedName {
	return types.NamespacedName{Namespace: o.Namespace, Name: o.ID}
}

// Apply sets the manager's leader election from the options; a leader that
// stops releases the Lease at once.
func (o *Options) Apply(m *manager.Options) {
	m.LeaderElection, m.LeaderElectionReleaseOnCancel = o.Elect, true
	m.LeaderElectionNamespace, m.LeaderElectionID = o.Namespace, o.ID
	m.LeaseDuration, m.RenewDeadline, m.RetryPeriod = ptr.To(o.LeaseDuration), ptr.To(o.RenewDeadline), ptr.To(o.RetryPeriod)
}
