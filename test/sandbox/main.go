// Command sandbox is what `make run` starts: a local cluster (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok), a small demo
// topology, and nodeguard running against it. It stays up until Ctrl-C and then
// stops everything it started.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

func main() {
	binDir := flag.String("bin-dir", harness.BinDir(), "Directory with the nodeguard binary and the control-plane tools (make build tools).")
	dir := flag.String("dir", filepath.Join(harness.RepoRoot(), ".sandbox"), "Directory for the sandbox's kubeconfig, logs, data and env.sh; emptied at start.")
	pods := flag.String("pod-stages", harness.PodsGeneral, "kwok pod stages: pod-general (realistic delays) or pod-fast (none).")
	metrics := flag.String("metrics-bind-address", "127.0.0.1:8080", "Where nodeguard serves its metrics (plain HTTP).")
	probes := flag.String("health-probe-bind-address", "127.0.0.1:8081", "Where nodeguard serves /healthz and /readyz.")
	flag.Parse()
	cfg := config{nodeguard: filepath.Join(*binDir, "nodeguard"), plugin: filepath.Join(*binDir, "kubectl-nodeguard"), metricsAddr: *metrics, probeAddr: *probes}
	if err := run(*dir, *pods, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

// config is what varies between make run and the tour test.
type config struct {
	nodeguard              string // the binary
	plugin                 string // kubectl-nodeguard, which env.sh puts on PATH
	metricsAddr, probeAddr string
}

// harnessOptions start the sandbox's control plane in dir.
func harnessOptions(dir, pods string) harness.Options {
	return harness.Options{
		Cluster: true, PodStages: pods, Dir: dir,
		// Registered with a locally generated CA, pointing at nodeguard below.
		WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
		// The install's admission policies, as kubectl apply -k
		// manifests/default applies them: nodeguard runs as its
		// ServiceAccount (nodeguardArgs).
		InstallPolicies: true,
	}
}

func run(dir, pods string, cfg config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Println("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok ...")
	env, err := harness.Start(ctx, harnessOptions(dir, pods))
	defer func() {
		fmt.Println("stopping the sandbox ...")
		if env != nil {
			_ = env.Stop()
		}
	}()
	if err != nil {
		if env != nil {
			fmt.Fprint(os.Stderr, env.LogTails(20))
		}
		return err
	}
	sb, err := up(ctx, env, cfg)
	if err != nil {
		return err
	}
	defer sb.stop()
	printWelcome(env, sb.emulator.URL())
	select {
	case <-ctx.Done():
	case <-sb.nodeguard.Done():
		fmt.Fprintf(os.Stderr, "nodeguard exited (%v); its log is %s\n", sb.nodeguard.Err(), sb.nodeguard.LogPath)
	}
	return nil
}

// sandbox is what runs on the control plane: the ARM emulator and nodeguard.
type sandbox struct {
	emulator  *armemulator.Server
	nodeguard *harness.Nodeguard
}

// up creates the demo topology on env's cluster, starts the ARM emulator and
// nodeguard, creates the budgets and writes env.sh for the reader's shell.
func up(ctx context.Context, env *harness.Env, cfg config) (*sandbox, error) {
	fmt.Println("creating the demo topology ...")
	if err := createDemo(ctx, env); err != nil {
		return nil, fmt.Errorf("creating the demo topology: %w", err)
	}
	emulator, err := armemulator.Start("127.0.0.1:0", emulatorSeed(), armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		return nil, fmt.Errorf("starting the ARM emulator: %w", err)
	}
	sb := &sandbox{emulator: emulator}
	if sb.nodeguard, err = startNodeguard(cfg, env, emulator.URL()); err != nil {
		sb.stop()
		return nil, err
	}
	if err := createDemoBudgets(ctx, env); err != nil {
		sb.stop()
		return nil, err
	}
	if err := waitGuarded(ctx, env); err != nil {
		sb.stop()
		return nil, err
	}
	if err := writeEnvFile(env, emulator.URL(), cfg); err != nil {
		sb.stop()
		return nil, err
	}
	return sb, nil
}

func (s *sandbox) stop() {
	if s.nodeguard != nil {
		_ = s.nodeguard.Stop(10 * time.Second)
	}
	s.emulator.Close()
}

// writeEnvFile writes env.sh beside the kubeconfig: sourced, it points a
// shell at the sandbox (KUBECONFIG), names where the ARM emulator (ARM) and
// nodeguard's metrics (METRICS) listen, which the README's tour uses, and
// puts the kubectl plugin on PATH (kubectl nodeguard).
func writeEnvFile(env *harness.Env, armURL string, cfg config) error {
	body := fmt.Sprintf("export KUBECONFIG=%s\nexport ARM=%s\nexport METRICS=http://%s\nexport PATH=%s:$PATH\n",
		env.Kubeconfig, armURL, cfg.metricsAddr, filepath.Dir(cfg.plugin))
	return os.WriteFile(filepath.Join(env.Dir, "env.sh"), []byte(body), 0o644)
}

func startNodeguard(cfg config, env *harness.Env, armURL string) (*harness.Nodeguard, error) {
	ng, err := harness.StartNodeguardProcess(cfg.nodeguard, filepath.Join(env.Dir, "nodeguard.log"), nodeguardArgs(cfg, env, armURL)...)
	if err != nil {
		return nil, fmt.Errorf("%w (make build)", err)
	}
	return ng, nil
}

func nodeguardArgs(cfg config, env *harness.Env, armURL string) []string {
	return append([]string{
		// As its ServiceAccount: the install's policies let only nodeguard
		// remove its finalizer.
		"--kubeconfig=" + env.NodeguardKubeconfig,
		"--metrics-bind-address=" + cfg.metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address=" + cfg.probeAddr,
		"--leader-election-namespace=" + demoNamespaceSystem,
		// The sandbox shares two cores with its control plane: the tour's
		// delete waits for its warnings rather than leave them out.
		"--delete-warnings-wait=2s",
	}, append(env.WebhookArgs(), harness.EmulatorArgs(armURL, demoSubscription, demoResourceGroup)...)...)
}

func printWelcome(env *harness.Env, armURL string) {
	fmt.Printf(`
nodeguard sandbox is up. In another terminal, take the tour in README.md, or:

  . %[1]s    # KUBECONFIG, ARM (the ARM emulator) and METRICS (nodeguard's metrics)
  kubectl get nodes,ndb
  kubectl get deploy,pdb -n %[2]s
  kubectl delete node %[3]s    # admitted: the system budget allows 1
  kubectl delete node %[5]s    # denied: the budget is used up
  kubectl describe ndb system
  kubectl get events --field-selector involvedObject.name=%[3]s

The ARM emulator (%[6]s) plays Azure: see every load-balancer backend entry and its AdminState with
  curl -s $ARM/emulator/state
  kubectl taint node %[7]s node.kubernetes.io/out-of-service=nodeshutdown:NoExecute   # entries go Down
  kubectl taint node %[7]s node.kubernetes.io/out-of-service-                         # back to None
  curl -s $METRICS/metrics | grep ^nodeguard_

Play cloud-provider-azure's stale pool write (read before the cut, PUT after it, no If-Match):
  P=$ARM/%[8]s
  curl -s $P > stale.json
  kubectl taint node %[7]s node.kubernetes.io/out-of-service=nodeshutdown:NoExecute
  op=$(curl -s -D - -o /dev/null -X PUT -H 'Content-Type: application/json' -d @stale.json $P | sed -n 's/\r$//;s/^Azure-AsyncOperation: //ip')
  until curl -s "$op" | grep -q Succeeded; do sleep 0.2; done                      # the write lands: the cut is undone
  kubectl get events -w --field-selector reason=LoadBalancerAdminStateReverted      # within ~5s: Down again

Logs of every component (and nodeguard.log) are in %[4]s.
Press Ctrl-C to stop everything.
`, filepath.Join(env.Dir, "env.sh"), demoNamespace, demoNodes[0].name, env.Dir, demoNodes[1].name, armURL, demoNodes[4].name,
		fmt.Sprintf("subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/kubernetes-internal/backendAddressPools/kubernetes",
			demoSubscription, demoResourceGroup))
}
