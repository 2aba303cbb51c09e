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
	dir := flag.String("dir", filepath.Join(harness.RepoRoot(), ".sandbox"), "Directory for the sandbox's kubeconfig, logs and data; emptied at start.")
	pods := flag.String("pod-stages", harness.PodsGeneral, "kwok pod stages: pod-general (realistic delays) or pod-fast (none).")
	flag.Parse()
	if err := run(*binDir, *dir, *pods); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox:", err)
		os.Exit(1)
	}
}

func run(binDir, dir, pods string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	fmt.Println("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok ...")
	env, err := harness.Start(ctx, harness.Options{
		Cluster: true, PodStages: pods, Dir: dir,
		// Registered with a locally generated CA, pointing at nodeguard below.
		WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
	})
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
	fmt.Println("creating the demo topology ...")
	if err := createDemo(ctx, env); err != nil {
		return fmt.Errorf("creating the demo topology: %w", err)
	}
	emulator, err := armemulator.Start("127.0.0.1:0", emulatorSeed(), armemulator.Options{Async: true, AsyncPolls: 1})
	if err != nil {
		return fmt.Errorf("starting the ARM emulator: %w", err)
	}
	defer emulator.Close()
	nodeguard, err := startNodeguard(binDir, env, emulator.URL())
	if err != nil {
		return err
	}
	if err := createDemoBudgets(ctx, env); err != nil {
		_ = nodeguard.Stop(10 * time.Second)
		return err
	}
	printWelcome(env, emulator.URL())
	select {
	case <-ctx.Done():
	case <-nodeguard.Done():
		fmt.Fprintf(os.Stderr, "nodeguard exited (%v); its log is %s\n", nodeguard.Err(), nodeguard.LogPath)
	}
	_ = nodeguard.Stop(10 * time.Second)
	return nil
}

func startNodeguard(binDir string, env *harness.Env, armURL string) (*harness.Nodeguard, error) {
	ng, err := harness.StartNodeguardProcess(filepath.Join(binDir, "nodeguard"), filepath.Join(env.Dir, "nodeguard.log"), nodeguardArgs(env, armURL)...)
	if err != nil {
		return nil, fmt.Errorf("%w (make build)", err)
	}
	return ng, nil
}

func nodeguardArgs(env *harness.Env, armURL string) []string {
	return append([]string{
		"--kubeconfig=" + env.Kubeconfig,
		"--metrics-bind-address=127.0.0.1:8080", "--metrics-secure=false",
		"--health-probe-bind-address=127.0.0.1:8081",
		"--leader-election-namespace=" + demoNamespaceSystem,
	}, append(env.WebhookArgs(), harness.EmulatorArgs(armURL, demoSubscription, demoResourceGroup)...)...)
}

func printWelcome(env *harness.Env, armURL string) {
	fmt.Printf(`
nodeguard sandbox is up. In another terminal:

  export KUBECONFIG=%[1]s
  kubectl get nodes,ndb
  kubectl get deploy,pdb -n %[2]s
  kubectl delete node %[3]s    # admitted: the system budget allows 1
  kubectl delete node %[5]s    # denied: the budget is used up
  kubectl describe ndb system
  kubectl get events --field-selector involvedObject.name=%[3]s

The ARM emulator plays Azure: see every load-balancer backend entry and its AdminState with
  curl -s %[6]s/emulator/state
  kubectl taint node %[7]s node.kubernetes.io/out-of-service=nodeshutdown:NoExecute   # entries go Down
  kubectl taint node %[7]s node.kubernetes.io/out-of-service-                         # back to None
  curl -s localhost:8080/metrics | grep ^nodeguard_

Play cloud-provider-azure's stale pool write (read before the cut, PUT after it, no If-Match):
  P=%[8]s
  curl -s $P > stale.json
  kubectl taint node %[7]s node.kubernetes.io/out-of-service=nodeshutdown:NoExecute
  op=$(curl -s -D - -o /dev/null -X PUT -H 'Content-Type: application/json' -d @stale.json $P | sed -n 's/\r$//;s/^Azure-AsyncOperation: //ip')
  until curl -s "$op" | grep -q Succeeded; do sleep 0.2; done                      # the write lands: the cut is undone
  kubectl get events -w --field-selector reason=LoadBalancerAdminStateReverted      # within ~5s: Down again

Logs of every component (and nodeguard.log) are in %[4]s.
Press Ctrl-C to stop everything.
`, env.Kubeconfig, demoNamespace, demoNodes[0].name, env.Dir, demoNodes[1].name, armURL, demoNodes[4].name,
		fmt.Sprintf("%s/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/kubernetes-internal/backendAddressPools/kubernetes",
			armURL, demoSubscription, demoResourceGroup))
}
