// Package harness starts real Kubernetes control planes for nodeguard's
// integration tests, e2e tests and sandbox:
//
//   - integration level: etcd and kube-apiserver (envtest), with nodeguard's CRDs
//     installed and, optionally, its webhook configurations;
//   - cluster level: plus kube-controller-manager, kube-scheduler and kwok, so
//     Deployments schedule onto simulated nodes, become Ready, and PDB status is
//     computed.
//
// Every binary comes from bin/ (make tools). No component outlives the test
// process, and each run has its own ports and data directories.
package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Pod stage profiles for kwok, named after the stock stage sets they load.
const (
	// PodsFast: pods become Ready and terminate with no delay.
	PodsFast = "pod-fast"
	// PodsGeneral: realistic delays (a pod starts in 1 to 6 s).
	PodsGeneral = "pod-general"
)

// nodeLeaseDurationSeconds makes kwok maintain node heartbeat Leases. Without it
// the node lifecycle controller marks every pod on kwok nodes not Ready after 40 s,
// PDBs then count no healthy pods, and every eviction is refused.
const nodeLeaseDurationSeconds = "40"

// defaultNodeMonitorGracePeriod is how long kube-controller-manager waits for
// a node's heartbeat before it counts the node NotReady (Options).
const defaultNodeMonitorGracePeriod = 40 * time.Second

// Options says what to start.
type Options struct {
	// Cluster adds kube-controller-manager, kube-scheduler and kwok.
	Cluster bool
	// PodStages is PodsFast (the default) or PodsGeneral.
	PodStages string
	// KwokParallelism, when above 0, is how many pod stages, node stages and
	// node Leases kwok plays at once (its default is 4 each). At thousands of
	// nodes on a busy machine 4 workers fall behind: pods take many minutes
	// to start and heartbeats lag.
	KwokParallelism int
	// NodeMonitorGracePeriod, when above 0, replaces kube-controller-manager's
	// 40 s without a heartbeat before a node counts NotReady. The node
	// lifecycle controller then marks the node's pods not Ready, and kwok,
	// unlike a kubelet whose node is back, never marks them Ready again: a
	// cluster of thousands of kwok nodes on 2 cores, whose heartbeats lag
	// under load though no node is dead, sets it long.
	NodeMonitorGracePeriod time.Duration
	// WebhookManifests are files or directories of webhook configurations that
	// envtest installs, pointing them at a local webhook server whose host, port
	// and certificate directory are in Env.Webhook.
	WebhookManifests []string
	// WithoutWebhooks names webhooks of WebhookManifests to leave out. Tests
	// that create NodeDisruptionBudgets before nodeguard runs leave out the
	// budget webhook (failurePolicy Fail), which would refuse them then.
	WithoutWebhooks []string
	// Dir holds logs, kubeconfig and data; a temporary directory when empty.
	Dir string
	// AuditPolicy, when set, is an audit policy (YAML) for kube-apiserver,
	// which then writes JSON audit events to Env.AuditLog.
	AuditPolicy string
	// WebhookClientCert makes kube-apiserver present a client certificate to
	// the webhook server of WebhookManifests (an AdmissionConfiguration with a
	// webhook kubeconfig); Env.WebhookClientCA is the CA that signed it.
	WebhookClientCert bool
	// NoMaintenanceNamespace leaves out the namespace kube-node-maintenance,
	// which nodeguard's install ships and the harness otherwise creates, for
	// tests that install it themselves (test/install).
	NoMaintenanceNamespace bool
	// InstallPolicies applies the install's ValidatingAdmissionPolicies and
	// bindings (manifests/default as kubectl kustomize renders it, plus the
	// components PolicyComponents names), right after the CRDs and webhook
	// configurations, binds NodeOperator's role, and waits until
	// kube-apiserver enforces them. nodeguard must then run as its
	// ServiceAccount (Env.NodeguardKubeconfig), and a test that writes
	// nodeguard's marks on a node does so as nodeguard (Env.AsNodeguard).
	InstallPolicies bool
	// PolicyComponents are components of manifests/components rendered with
	// manifests/default for InstallPolicies, e.g. managed-nodes.
	PolicyComponents []string
}

// Env is a running control plane.
type Env struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Client is a client for Config with the core and nodeguard schemes.
	Client client.Client
	// Scheme has the core and nodeguard types.
	Scheme *runtime.Scheme
	// Kubeconfig is the path of an admin kubeconfig file, for kubectl and for
	// the components.
	Kubeconfig string
	// Dir holds the logs and data of this run.
	Dir string
	// Webhook is where installed webhook configurations send requests.
	Webhook *envtest.WebhookInstallOptions
	// AuditLog is the path of kube-apiserver's audit log (Options.AuditPolicy).
	AuditLog string
	// WebhookClientCA is the CA file of the client certificate kube-apiserver
	// presents to webhooks (Options.WebhookClientCert), for nodeguard's
	// --webhook-client-ca.
	WebhookClientCA string
	// NodeguardKubeconfig is Kubeconfig acting as nodeguard's ServiceAccount
	// (NodeguardUser, impersonated): what nodeguard runs with.
	NodeguardKubeconfig string
	// AsNodeguard is Client acting as nodeguard's ServiceAccount, for a test
	// that writes what only nodeguard may (its finalizer's removal, its
	// annotations and taint) under Options.InstallPolicies.
	AsNodeguard client.Client

	testEnv            *envtest.Environment
	releaseWebhookPort func()
	processes          []*process
	removeDir          bool
	apiLogPath         string
}

// NewScheme returns a scheme with the core Kubernetes, CRD and nodeguard
// types.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = apiextensionsv1.AddToScheme(s)
	_ = ngv1alpha1.AddToScheme(s)
	return s
}

// Start starts a control plane. Call Stop when done, also after an error.
func Start(ctx context.Context, opts Options) (*Env, error) {
	e := &Env{Dir: opts.Dir, Scheme: NewScheme()}
	if e.Dir == "" {
		dir, err := os.MkdirTemp("", "nodeguard-harness-")
		if err != nil {
			return nil, err
		}
		e.Dir, e.removeDir = dir, true
	}
	if err := os.MkdirAll(e.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := e.startAPIServer(opts); err != nil {
		return e, err
	}
	if opts.InstallPolicies {
		if err := e.installPolicies(ctx, opts.PolicyComponents); err != nil {
			return e, err
		}
	}
	if !opts.NoMaintenanceNamespace {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ngv1alpha1.MaintenanceLeaseNamespace}}
		if err := e.Client.Create(ctx, ns); err != nil {
			return e, fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
	}
	if opts.Cluster {
		if err := e.startCluster(ctx, opts); err != nil {
			return e, err
		}
	}
	return e, nil
}

func (e *Env) startAPIServer(opts Options) error {
	wrappers := filepath.Join(e.Dir, "wrappers")
	if err := os.MkdirAll(wrappers, 0o755); err != nil {
		return err
	}
	apiserverPath, err := kubeBinary("kube-apiserver")
	if err != nil {
		return err
	}
	apiserver, err := withParentDeathSignal(wrappers, apiserverPath)
	if err != nil {
		return err
	}
	etcd, err := binaryWithParentDeathSignal(wrappers, "etcd")
	if err != nil {
		return err
	}
	e.apiLogPath = filepath.Join(e.Dir, "kube-apiserver.log")
	apiLog, err := os.Create(e.apiLogPath)
	if err != nil {
		return err
	}
	etcdLog, err := os.Create(filepath.Join(e.Dir, "etcd.log"))
	if err != nil {
		return err
	}
	// The components' state (etcd's data, kube-apiserver's certificates)
	// lives in the env's directory, so that it goes with the directory even
	// when the process was killed before Stop.
	etcdData, certs := filepath.Join(e.Dir, "etcd"), filepath.Join(e.Dir, "apiserver")
	for _, dir := range []string{etcdData, certs} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	apiServer := &envtest.APIServer{Path: apiserver, CertDir: certs, Out: apiLog, Err: apiLog}
	if gates := featureGates(); gates != "" {
		apiServer.Configure().Set("feature-gates", gates)
	}
	if opts.AuditPolicy != "" {
		policy := filepath.Join(e.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(opts.AuditPolicy), 0o644); err != nil {
			return err
		}
		e.AuditLog = filepath.Join(e.Dir, "audit.log")
		apiServer.Configure().Set("audit-policy-file", policy).Set("audit-log-path", e.AuditLog).Set("audit-log-format", "json")
	}
	webhooks := envtest.WebhookInstallOptions{Paths: opts.WebhookManifests}
	if len(opts.WithoutWebhooks) > 0 {
		mutating, validating, err := webhookConfigurations(opts.WebhookManifests, opts.WithoutWebhooks)
		if err != nil {
			return fmt.Errorf("reading webhook configurations: %w", err)
		}
		webhooks = envtest.WebhookInstallOptions{MutatingWebhooks: mutating, ValidatingWebhooks: validating}
	}
	if len(opts.WebhookManifests) > 0 {
		// The webhook server starts later, in a test: reserve its port.
		port, release, err := reservePort()
		if err != nil {
			return err
		}
		webhooks.LocalServingHost, webhooks.LocalServingPort, e.releaseWebhookPort = "127.0.0.1", port, release
		if opts.WebhookClientCert {
			admission, ca, err := webhookClientCert(filepath.Join(e.Dir, "webhook-client"), webhooks.LocalServingHost, port)
			if err != nil {
				return fmt.Errorf("webhook client certificate: %w", err)
			}
			apiServer.Configure().Set("admission-control-config-file", admission)
			e.WebhookClientCA = ca
		}
	}
	e.testEnv = &envtest.Environment{
		Scheme:                   e.Scheme,
		CRDDirectoryPaths:        []string{CRDDir()},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStopTimeout:  stopGrace,
		ControlPlaneStartTimeout: 90 * time.Second,
		WebhookInstallOptions:    webhooks,
		ControlPlane: envtest.ControlPlane{
			APIServer: apiServer,
			Etcd:      &envtest.Etcd{Path: etcd, DataDir: etcdData, Out: etcdLog, Err: etcdLog},
		},
	}
	if _, err := e.testEnv.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	if len(opts.WebhookManifests) > 0 {
		e.Webhook = &e.testEnv.WebhookInstallOptions
	}
	admin, err := e.testEnv.AddUser(envtest.User{Name: "nodeguard-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding admin user: %w", err)
	}
	e.Config = admin.Config()
	e.Config.QPS, e.Config.Burst = 500, 1000
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	e.Kubeconfig = filepath.Join(e.Dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kubeconfig, 0o600); err != nil {
		return err
	}
	if e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		return err
	}
	return e.nodeguardIdentity()
}

func binaryWithParentDeathSignal(dir, name string) (string, error) {
	path, err := binary(name)
	if err != nil {
		return "", err
	}
	return withParentDeathSignal(dir, path)
}

func (e *Env) startCluster(ctx context.Context, opts Options) error {
	kc := "--kubeconfig=" + e.Kubeconfig
	authn := []string{kc, "--authentication-kubeconfig=" + e.Kubeconfig, "--authorization-kubeconfig=" + e.Kubeconfig}
	kcm := append(append([]string{}, authn...),
		"--leader-elect=false", "--secure-port=0",
		"--controllers=*,-serviceaccount-token", "--use-service-account-credentials=false",
		// Evict pods from a NotReady node soon enough to matter in tests.
		"--node-monitor-grace-period="+cmp.Or(opts.NodeMonitorGracePeriod, defaultNodeMonitorGracePeriod).String(),
	)
	if gates := featureGates(); gates != "" {
		kcm = append(kcm, "--feature-gates="+gates)
	}
	if err := e.startKube("kube-controller-manager", kcm...); err != nil {
		return err
	}
	if err := e.startKube("kube-scheduler", append(authn, "--leader-elect=false", "--secure-port=0")...); err != nil {
		return err
	}
	stages, err := e.kwokStages(opts.PodStages, opts.KwokParallelism)
	if err != nil {
		return err
	}
	// kwok plays the kubelet of annotated nodes only (builder.Node annotates),
	// so that a test can have a node whose kubelet is dead.
	if err := e.start("kwok", kc, "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--server-address=127.0.0.1:0",
		"--config="+stages, "--node-lease-duration-seconds="+nodeLeaseDurationSeconds,
		// Room for tens of thousands of pod IPs (the default /24 has 254).
		"--cidr=10.128.0.1/9",
	); err != nil {
		return err
	}
	return e.waitForComponents(ctx)
}

// kwokStages writes the stock node stages plus the chosen pod stages, and
// kwok's worker counts when set, into one kwok config file.
func (e *Env) kwokStages(pods string, parallelism int) (string, error) {
	if pods == "" {
		pods = PodsFast
	}
	var docs []string
	for _, name := range []string{"node-fast", "node-heartbeat-with-lease", pods} {
		path, err := binary(filepath.Join("kwok-stages", name+".yaml"))
		if err != nil {
			return "", err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		docs = append(docs, string(data))
	}
	if parallelism > 0 {
		docs = append(docs, fmt.Sprintf("---\napiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"+
			"  podPlayStageParallelism: %[1]d\n  nodePlayStageParallelism: %[1]d\n  nodeLeaseParallelism: %[1]d\n", parallelism))
	}
	out := filepath.Join(e.Dir, "kwok-stages.yaml")
	return out, os.WriteFile(out, []byte(strings.Join(docs, "\n")), 0o644)
}

// featureGates are the alpha features nodeguard uses, for kube-apiserver and
// kube-controller-manager of the newest release (the oldest knows none of
// them and refuses unknown gates): KEP-5683's Node lifecycle conditions,
// which nodeguard writes while it drains.
func featureGates() string {
	if kubeVersion() != "" {
		return ""
	}
	return "NodeLifecycleConditions=true"
}

func (e *Env) start(name string, args ...string) error {
	path, err := binary(name)
	if err != nil {
		return err
	}
	return e.startPath(name, path, args...)
}

// startKube starts a Kubernetes component of the selected release.
func (e *Env) startKube(name string, args ...string) error {
	path, err := kubeBinary(name)
	if err != nil {
		return err
	}
	return e.startPath(name, path, args...)
}

func (e *Env) startPath(name, path string, args ...string) error {
	p, err := startProcess(name, e.Dir, path, args...)
	if err != nil {
		return err
	}
	e.processes = append(e.processes, p)
	return nil
}

// waitForComponents waits until the controller manager has created the default
// ServiceAccount (it is up and syncing), and fails early if a component exits.
func (e *Env) waitForComponents(ctx context.Context) error {
	return Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if exited := e.exitedTails(20); exited != "" {
			return false, errors.New(exited)
		}
		var sa corev1.ServiceAccount
		err := e.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "default"}, &sa)
		return err == nil, nil
	})
}

// CheckAlive returns an error naming any component that has exited.
func (e *Env) CheckAlive() error {
	var errs []error
	for _, p := range e.processes {
		if done, err := p.exited(); done {
			errs = append(errs, fmt.Errorf("%s exited: %v", p.name, err))
		}
	}
	return errors.Join(errs...)
}

// exitedTails returns the last lines of the log of each component that has
// exited: the likely cause of a failing start or package.
func (e *Env) exitedTails(lines int) string {
	var b strings.Builder
	for _, p := range e.processes {
		if done, err := p.exited(); done {
			fmt.Fprintf(&b, "%s exited (%v):\n%s\n", p.name, err, tail(p.logPath, lines))
		}
	}
	return b.String()
}

// LogTails returns the last lines of every component's log, for a failing test.
func (e *Env) LogTails(lines int) string {
	var b strings.Builder
	paths := []string{e.apiLogPath, filepath.Join(e.Dir, "etcd.log")}
	for _, p := range e.processes {
		paths = append(paths, p.logPath)
	}
	for _, path := range paths {
		if path == "" {
			continue
		}
		fmt.Fprintf(&b, "==> %s <==\n%s\n\n", filepath.Base(path), tail(path, lines))
	}
	return b.String()
}

// Stop stops every component, newest first, and removes the run's directory if
// the harness created it.
func (e *Env) Stop() error {
	var errs []error
	for i := len(e.processes) - 1; i >= 0; i-- {
		e.processes[i].stop()
	}
	if e.testEnv != nil {
		if err := e.testEnv.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if e.releaseWebhookPort != nil {
		e.releaseWebhookPort()
	}
	if e.removeDir {
		errs = append(errs, os.RemoveAll(e.Dir))
	}
	return errors.Join(errs...)
}
