package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The replace section: a node holding the only replica of a Deployment under
// minAvailable: 1. kubectl drain gets 429 until its timeout; nodeguard has the
// Deployment start the replacement elsewhere first (replacement first).
const (
	replaceKubectlNS   = "replace-kubectl"
	replaceNodeguardNS = "replace-nodeguard"
	replaceLabel       = "bench.nodeguard.io/replace"
)

// replaceResult is the replace section's outcome.
type replaceResult struct {
	Profile string        `json:"profile"`
	Timeout time.Duration `json:"kubectlTimeout"`
	// KubectlExit is when kubectl drain exited; KubectlDone whether it
	// finished the drain (it cannot: the PDB allows no disruption).
	KubectlExit     time.Duration `json:"kubectlExit"`
	KubectlDone     bool          `json:"kubectlDrained"`
	KubectlError    string        `json:"kubectlError,omitempty"`
	KubectlRefusals int           `json:"kubectl429"`
	KubectlRequests int           `json:"kubectlEvictions"`
	// NodeguardReleased is when nodeguard released its node (finalizer
	// removed, node gone) after kubectl delete node.
	NodeguardReleased time.Duration `json:"nodeguardNodeReleased"`
	// MinReady is the fewest Ready replicas each Deployment had at any moment
	// from the start (kubectl, nodeguard).
	MinReady [2]int `json:"minReady"`
	// NodeguardEvictions are nodeguard's eviction requests in its namespace;
	// Restarts its PATCHes of the Deployment that succeeded.
	NodeguardEvictions int `json:"nodeguardEvictions"`
	Restarts           int `json:"restarts"`
}

// runReplace drains two identical nodes at once, each carrying one replica
// of a Deployment under minAvailable: 1: one with kubectl drain
// --timeout, one by deleting it under nodeguard.
func runReplace(ctx context.Context, c config, env *harness.Env, profile string) (*replaceResult, error) {
	cl := env.Client
	logf("replace: two nodes, each with the only replica of a Deployment under minAvailable: 1")
	var emuNodes []armemulator.Node
	for i, ns := range []string{replaceKubectlNS, replaceNodeguardNS} {
		if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
		ip := fmt.Sprintf("10.30.%d.4", i)
		opts := []builder.NodeOption{builder.WithLabels("group", ns), builder.WithInternalIP(ip), builder.WithProviderID(vmssID("replace", i))}
		if ns == replaceNodeguardNS {
			opts = append(opts, builder.WithLabels(managedLabel, "true"))
			emuNodes = append(emuNodes, armemulator.Node{Name: ns + "-target", IPs: []string{ip}, ProviderID: vmssID("replace", i)})
		}
		if err := create(ctx, cl, builder.Node(ns+"-target", opts...)); err != nil {
			return nil, err
		}
		d := builder.Deployment(ns, "web", 1, builder.OnNodes("group", ns))
		d.Spec.Template.Labels[replaceLabel] = "true"
		if err := create(ctx, cl, d); err != nil {
			return nil, err
		}
		if err := create(ctx, cl, builder.PDB(ns, "web", builder.MinAvailable("1"))); err != nil {
			return nil, err
		}
	}
	for _, ns := range []string{replaceKubectlNS, replaceNodeguardNS} {
		if err := waitReadyOn(ctx, cl, ns, ns+"-target", 1); err != nil {
			return nil, err
		}
		if err := create(ctx, cl, builder.Node(ns+"-spare", builder.WithLabels("group", ns))); err != nil {
			return nil, err
		}
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		return nil, err
	}
	defer emu.Close()
	proxy, err := startAPIProxy(env, env.Dir, "replace-proxy")
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	ng, err := startNodeguard(c.nodeguard, env, proxy.Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-replace.log"))
	if err != nil {
		return nil, err
	}
	defer ng.stop()
	target := replaceNodeguardNS + "-target"
	if err := waitFinalizer(ctx, cl, target); err != nil {
		return nil, err
	}
	workloads := map[string]int{replaceKubectlNS + "/web": 1, replaceNodeguardNS + "/web": 1}
	tr, err := startPodTracker(ctx, env.Config, replaceLabel+"=true", workloads)
	if err != nil {
		return nil, err
	}

	logf("replace: kubectl drain %s-target --timeout=%s and kubectl delete node %s, at once", replaceKubectlNS, c.replaceTimeout, target)
	r := &replaceResult{Profile: profile, Timeout: c.replaceTimeout}
	start := tr.begin(replaceKubectlNS+"-target", target)
	var wg sync.WaitGroup
	var kubectlOut []byte
	var kubectlErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", proxy.Kubeconfig, "drain", replaceKubectlNS+"-target",
			"--ignore-daemonsets", "--delete-emptydir-data", "--timeout="+c.replaceTimeout.String())
		kubectlOut, kubectlErr = cmd.CombinedOutput()
		r.KubectlExit = time.Since(start)
	}()
	if out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig, "delete", "node", target, "--wait=false").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kubectl delete node: %v: %s", err, out)
	}
	err = harness.Poll(ctx, c.replaceTimeout+time.Minute, func(ctx context.Context) (bool, error) {
		gone, err := harness.NodeGone(ctx, cl, target)
		if gone && r.NodeguardReleased == 0 {
			r.NodeguardReleased = time.Since(start)
		}
		return gone, err
	})
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("waiting for nodeguard to release %s: %w", target, err)
	}
	r.KubectlDone = kubectlErr == nil
	if kubectlErr != nil {
		r.KubectlError = lastLine(string(kubectlOut))
	}
	r.KubectlRefusals = evictionsAnswered(proxy, replaceKubectlNS, 429)
	r.KubectlRequests = evictionsAnswered(proxy, replaceKubectlNS, 0)
	r.NodeguardEvictions = evictionsAnswered(proxy, replaceNodeguardNS, 0)
	for _, w := range proxy.Writes("PATCH", "/apis/apps/v1/namespaces/"+replaceNodeguardNS+"/deployments/web") {
		if w.Status == 200 {
			r.Restarts++
		}
	}
	for i, ns := range []string{replaceKubectlNS, replaceNodeguardNS} {
		r.MinReady[i] = minValue(tr.healthyTimeline(ns + "/web"))
	}
	logf("replace: nodeguard released its node at %s (min Ready %d); kubectl drain exited at %s (drained: %v)",
		bench.Seconds(r.NodeguardReleased), r.MinReady[1], bench.Seconds(r.KubectlExit), r.KubectlDone)
	return r, nil
}

func minValue(pts []bench.Point) int {
	m := -1
	for _, p := range pts {
		if m < 0 || p.V < m {
			m = p.V
		}
	}
	return m
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func replaceTable(r *replaceResult) *bench.Table {
	if r == nil {
		return nil
	}
	t := &bench.Table{
		Title:  fmt.Sprintf("5. Replacement first: the only replica of a Deployment under minAvailable: 1 (kwok %s)", r.Profile),
		Header: []string{"drainer", "outcome", "time", "fewest Ready replicas", "eviction requests (429)", "Deployment restarts"},
	}
	kubectl := "did not finish: " + r.KubectlError
	switch {
	case r.KubectlDone:
		kubectl = "drained"
	case strings.Contains(r.KubectlError, "global timeout reached"):
		kubectl = "did not finish: timed out, the pod still on the node"
	}
	t.AddRow(fmt.Sprintf("`kubectl drain --timeout=%s`", r.Timeout), kubectl, bench.Seconds(r.KubectlExit), fmt.Sprint(r.MinReady[0]),
		fmt.Sprintf("%d (%d)", r.KubectlRequests, r.KubectlRefusals), "0")
	t.AddRow("nodeguard (`kubectl delete node`)", "node released", bench.Seconds(r.NodeguardReleased), fmt.Sprint(r.MinReady[1]),
		fmt.Sprint(r.NodeguardEvictions), fmt.Sprint(r.Restarts))
	t.Note("Both nodes at once, each with one replica of its own Deployment (default maxSurge 25%%) under a minAvailable: 1 PDB and an empty spare node. kubectl drain retries the eviction (429) every 5 s until its timeout; the pod never leaves.")
	t.Note("nodeguard's time runs from kubectl delete node until the node is gone. It includes the maintenance Lease, cordon, AdminState Down, the %s --blocked-pdb-settle before it calls the PDB blocked by design, the restart (pod-template annotation nodeguard.io/restartedAt), the new pod becoming Ready on the spare, the Deployment controller removing the old one, then release. Fewest Ready replicas is the minimum over the whole run, from a watch of the pods.", finalizer.DefaultBlockedPDBSettle)
	return t
}
