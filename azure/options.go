package azure

import (
	"flag"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/config"
)

// Options are the Azure flags; see config.Options.
type Options struct {
	config.Options
}

// NewOptions returns Options with their defaults, ready for BindFlags.
func NewOptions() Options { return Options{Options: config.NewOptions()} }

// BindFlags registers the --azure-* flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) { o.Options.BindFlags(fs) }

// tryTimeoutDivisor: one try of an ARM call gets this fraction of
// --azure-request-timeout.
const tryTimeoutDivisor = 4

// ManagerOption changes how NewManager builds a Manager (mostly for tests).
type ManagerOption func(*managerSettings)

type managerSettings struct {
	clock         clock.WithTicker
	client        armclient.Client
	retry         policy.RetryOptions
	pollFrequency time.Duration
	transport     policy.Transporter
	credential    azcore.TokenCredential
	log           logr.Logger
	records       RecordStore
	nodes         client.Reader
}

// WithClock sets the clock (default: real time).
func WithClock(c clock.WithTicker) ManagerOption { return func(s *managerSettings) { s.clock = c } }

// WithARMClient replaces the ARM client built from the configuration.
func WithARMClient(c armclient.Client) ManagerOption {
	return func(s *managerSettings) { s.client = c }
}

// WithSDKRetry overrides the Azure SDK's retry options (tests shorten delays).
func WithSDKRetry(r policy.RetryOptions) ManagerOption {
	return func(s *managerSettings) { s.retry = r }
}

// WithPollFrequency sets how often long-running writes are polled.
func WithPollFrequency(d time.Duration) ManagerOption {
	return func(s *managerSettings) { s.pollFrequency = d }
}

// WithCredential replaces the credential built from the configuration.
func WithCredential(c azcore.TokenCredential) ManagerOption {
	return func(s *managerSettings) { s.credential = c }
}

// WithRecords sets where the manager records the entries it set Down
// (default: in memory, lost on restart; nodeguard passes LeaseRecords).
func WithRecords(r RecordStore) ManagerOption { return func(s *managerSettings) { s.records = r } }

// WithNodeReader lets the manager see which nodes exist, to find the gone
// nodes whose recorded entries it restores. Without it, a node is known gone
// only through Forget.
func WithNodeReader(r client.Reader) ManagerOption { return func(s *managerSettings) { s.nodes = r } }

// WithLogger sets the logger used outside Start's context.
func WithLogger(l logr.Logger) ManagerOption { return func(s *managerSettings) { s.log = l } }
