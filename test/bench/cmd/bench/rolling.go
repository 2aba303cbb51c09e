package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The rolling section: every node of a group replaced, as an upgrade does,
// under a node budget of rollingBudget and PDBs; a helper plays the
// autoscaler and creates a replacement node as each old one goes. nodeguard
// gets every old node deleted at once; the comparator is a script that runs
// kubectl drain + kubectl delete node on rollingBudget nodes at a time.
const (
	rollingKubectlNS   = "rolling-kubectl"
	rollingNodeguardNS = "rolling-nodeguard"
	rollingLabel       = "bench.nodeguard.io/rolling"
	rollingBudget      = 3
	// rollingRetry is how often the upgrade driver retries a delete that
	// nodeguard denied (429: the node budget allows none now).
	rollingRetry = time.Second
)

type rollingResult struct {
	Nodes    int `json:"nodes"`
	Apps     int `json:"apps"`
	Replicas int `json:"replicas"`
	// Per drainer (kubectl, nodeguard).
	Total [2]time.Duration `json:"total"`
	// MaxUnavailable is the most nodes of the group unavailable at once;
	// NodeViolations how many times that count went above the budget.
	MaxUnavailable [2]int `json:"maxUnavailableNodes"`
	NodeViolations [2]int `json:"nodeViolations"`
	// MinHealthy is the fewest Ready pods any one Deployment had;
	// PDBViolations how many times a Deployment went below minAvailable.
	MinHealthy    [2]int          `json:"minHealthy"`
	PDBViolations [2]int          `json:"pdbViolations"`
	API           [2]requestCount `json:"api"`
	// Denied are the deletes nodeguard's webhook refused (and the driver
	// retried).
	Denied int `json:"deniedDeletes"`
}

func rollingGroups() []string { return []string{rollingKubectlNS, rollingNodeguardNS} }

func oldNode(group string, i int) string { return fmt.Sprintf("%s-old-%02d", group, i) }

// runRolling replaces every node of two identical groups at once: one with
// the kubectl script, one by deleting every node under nodeguard.
func runRolling(ctx context.Context, c config, env *harness.Env) (*rollingResult, error) {
	cl := env.Client
	r := &rollingResult{Nodes: c.rollingNodes, Apps: c.rollingApps, Replicas: c.rollingReplicas}
	logf("rolling: %d nodes per group, %d Deployments × %d replicas under minAvailable %d PDBs, node budget %d",
		r.Nodes, r.Apps, r.Replicas, r.Replicas-1, rollingBudget)
	var emuNodes []armemulator.Node
	for g, group := range rollingGroups() {
		if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: group}}); err != nil {
			return nil, err
		}
		for i := range c.rollingNodes {
			name, ip, id := oldNode(group, i), fmt.Sprintf("10.50.%d.%d", g, i+1), vmssID(group, i)
			opts := []builder.NodeOption{builder.WithLabels("group", group, rollingLabel, "true"), builder.WithInternalIP(ip), builder.WithProviderID(id)}
			if group == rollingNodeguardNS {
				opts = append(opts, builder.WithLabels(managedLabel, "true"))
				emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: id})
			}
			if err := create(ctx, cl, builder.Node(name, opts...)); err != nil {
				return nil, err
			}
		}
		for a := range c.rollingApps {
			app := fmt.Sprintf("app%d", a)
			d := builder.Deployment(group, app, int32(c.rollingReplicas), builder.OnNodes("group", group))
			d.Spec.Template.Labels[rollingLabel] = "true"
			if err := create(ctx, cl, d); err != nil {
				return nil, err
			}
			if err := create(ctx, cl, builder.PDB(group, app, builder.MinAvailable(fmt.Sprint(c.rollingReplicas-1)))); err != nil {
				return nil, err
			}
		}
	}
	if err := create(ctx, cl, builder.NDB("rolling", builder.NDBSelecting("group", rollingNodeguardNS), builder.NDBMaxUnavailable(fmt.Sprint(rollingBudget)))); err != nil {
		return nil, err
	}
	workloads := map[string]int{}
	for _, group := range rollingGroups() {
		for a := range c.rollingApps {
			workloads[fmt.Sprintf("%s/app%d", group, a)] = c.rollingReplicas
		}
		if err := waitReadyOn(ctx, cl, group, "", c.rollingApps*c.rollingReplicas); err != nil {
			return nil, err
		}
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{}), armemulator.Options{})
	if err != nil {
		return nil, err
	}
	defer emu.Close()
	var api [2]*requestCounter
	for g, group := range rollingGroups() {
		if api[g], err = startRequestCounter(env.Config, filepath.Join(env.Dir, group+".kubeconfig")); err != nil {
			return nil, err
		}
		defer api[g].close()
	}
	ng, err := startNodeguard(c.nodeguard, env, api[1].Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-rolling.log"))
	if err != nil {
		return nil, err
	}
	defer ng.stop()
	for i := range c.rollingNodes {
		if err := waitFinalizer(ctx, cl, oldNode(rollingNodeguardNS, i)); err != nil {
			return nil, err
		}
	}
	tr, err := startPodTracker(ctx, env.Config, rollingLabel+"=true", workloads)
	if err != nil {
		return nil, err
	}
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	mon, err := startNodeMonitor(mctx, env, c.rollingNodes)
	if err != nil {
		return nil, err
	}

	logf("rolling: the kubectl script (%d at a time) and nodeguard (all %d deleted at once) replace their groups", rollingBudget, c.rollingNodes)
	before := [2]requestCount{api[0].snapshot(), api[1].snapshot()}
	start := tr.begin()
	mon.begin()
	var wg sync.WaitGroup
	var errs [2]error
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs[0] = rollWithKubectl(ctx, api[0], c.rollingNodes)
		r.Total[0] = time.Since(start)
	}()
	go func() {
		defer wg.Done()
		r.Denied, errs[1] = rollWithNodeguard(ctx, cl, c.rollingNodes, mon)
		r.Total[1] = time.Since(start)
	}()
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	for g, group := range rollingGroups() {
		r.API[g] = api[g].snapshot().since(before[g])
		r.MaxUnavailable[g], r.NodeViolations[g] = mon.result(group)
		r.MinHealthy[g] = c.rollingReplicas
		for a := range c.rollingApps {
			pts := tr.healthyTimeline(fmt.Sprintf("%s/app%d", group, a))
			r.MinHealthy[g] = min(r.MinHealthy[g], minValue(pts))
			r.PDBViolations[g] += dropsBelow(pts, c.rollingReplicas-1)
		}
	}
	logf("rolling: kubectl script %s, nodeguard %s; node budget exceeded %d (kubectl), %d (nodeguard) times; PDBs broken %d, %d times",
		bench.Seconds(r.Total[0]), bench.Seconds(r.Total[1]), r.NodeViolations[0], r.NodeViolations[1], r.PDBViolations[0], r.PDBViolations[1])
	return r, nil
}

// rollWithKubectl drains and deletes every old node, rollingBudget at a time.
func rollWithKubectl(ctx context.Context, api *requestCounter, nodes int) error {
	var names []string
	for i := range nodes {
		names = append(names, oldNode(rollingKubectlNS, i))
	}
	return forEach(ctx, names, rollingBudget, func(ctx context.Context, n string) error {
		for _, args := range [][]string{
			{"drain", n, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=10m"},
			{"delete", "node", n},
		} {
			if out, err := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", api.Kubeconfig}, args...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, lastLine(string(out)))
			}
		}
		return nil
	})
}

// rollWithNodeguard deletes every old node at once, as an upgrade driver
// does, retrying each delete the webhook denies every rollingRetry, and
// waits until every old node is gone. It returns the denials.
func rollWithNodeguard(ctx context.Context, cl client.Client, nodes int, mon *nodeMonitor) (int, error) {
	var names []string
	for i := range nodes {
		names = append(names, oldNode(rollingNodeguardNS, i))
	}
	retries, err := deleteRetrying(ctx, cl, names)
	if err != nil {
		return retries.Denied, err
	}
	if retries.WebhookFailed > 0 {
		return retries.Denied, fmt.Errorf("%d deletes got no answer from nodeguard's webhook in time", retries.WebhookFailed)
	}
	return retries.Denied, mon.waitGone(ctx, rollingNodeguardNS, 10*time.Minute)
}

// deleteRetries counts the deletes a deleter had to retry.
type deleteRetries struct {
	// Denied were answered 429 by the webhook: the budget allows none now,
	// or the claim lost a race.
	Denied int `json:"denied"`
	// WebhookFailed never got the webhook's answer in time: kube-apiserver
	// answered 500 "failed calling webhook" (failurePolicy Fail).
	WebhookFailed int `json:"webhookFailed"`
}

// deleteRetrying deletes the nodes at once, one request each, and retries
// every delete the webhook denies (429) or does not answer in time every
// rollingRetry until each is accepted.
func deleteRetrying(ctx context.Context, cl client.Client, nodes []string) (deleteRetries, error) {
	pending := map[string]bool{}
	for _, n := range nodes {
		pending[n] = true
	}
	var retries deleteRetries
	t := time.NewTicker(rollingRetry)
	defer t.Stop()
	for {
		var mu sync.Mutex
		var names []string
		for n := range pending {
			names = append(names, n)
		}
		if err := forEach(ctx, names, len(names), func(ctx context.Context, n string) error {
			err := cl.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil || apierrors.IsNotFound(err):
				delete(pending, n)
			case apierrors.IsTooManyRequests(err):
				retries.Denied++
			case apierrors.IsInternalError(err) && strings.Contains(err.Error(), "failed calling webhook"):
				retries.WebhookFailed++
			default:
				return fmt.Errorf("deleting node %s: %w", n, err)
			}
			return nil
		}); err != nil {
			return retries, err
		}
		if len(pending) == 0 {
			return retries, nil
		}
		select {
		case <-ctx.Done():
			return retries, ctx.Err()
		case <-t.C:
		}
	}
}

// dropsBelow counts the times a step function went below floor.
func dropsBelow(pts []bench.Point, floor int) int {
	n, below := 0, false
	for _, p := range pts {
		if p.V < floor && !below {
			n++
		}
		below = p.V < floor
	}
	return n
}

// nodeMonitor watches the rolling groups' nodes. It plays the autoscaler (a
// replacement node, same labels, as soon as an old node is gone) and counts,
// per group, the nodes unavailable at once: cordoned, deleting, NotReady or
// tainted as the node budget reads them, from the node's first Ready on (a
// joining node is not a disruption).
type nodeMonitor struct {
	cl    client.Client
	nodes int

	mu         sync.Mutex
	began      bool
	all        map[string]*corev1.Node
	seenReady  map[string]bool
	replaced   map[string]bool
	maxUnav    map[string]int
	violations map[string]int
	over       map[string]bool
	changed    chan struct{}
}

func startNodeMonitor(ctx context.Context, env *harness.Env, nodes int) (*nodeMonitor, error) {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return nil, err
	}
	m := &nodeMonitor{cl: env.Client, nodes: nodes, all: map[string]*corev1.Node{}, seenReady: map[string]bool{}, replaced: map[string]bool{},
		maxUnav: map[string]int{}, violations: map[string]int{}, over: map[string]bool{}, changed: make(chan struct{}, 1)}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = rollingLabel + "=true" }))
	inf := f.Core().V1().Nodes().Informer()
	if err := watchSynced(ctx, f, inf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.observe(ctx, obj, false) },
		UpdateFunc: func(_, obj any) { m.observe(ctx, obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			m.observe(ctx, obj, true)
		},
	}); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *nodeMonitor) begin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.began = true
}

func (m *nodeMonitor) observe(ctx context.Context, obj any, deleted bool) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	group := n.Labels["group"]
	m.mu.Lock()
	if deleted {
		delete(m.all, n.Name)
	} else {
		m.all[n.Name] = n
		if up, _ := budget.Unavailable(n, nil); !up {
			m.seenReady[n.Name] = true
		}
	}
	replace := deleted && m.began && strings.Contains(n.Name, "-old-") && !m.replaced[n.Name]
	if replace {
		m.replaced[n.Name] = true
	}
	if m.began {
		unav := m.unavailable(group)
		m.maxUnav[group] = max(m.maxUnav[group], unav)
		if unav > rollingBudget && !m.over[group] {
			m.violations[group]++
		}
		m.over[group] = unav > rollingBudget
	}
	m.mu.Unlock()
	select {
	case m.changed <- struct{}{}:
	default:
	}
	if replace {
		// The autoscaler: a new node with the old one's labels.
		name := strings.Replace(n.Name, "-old-", "-new-", 1)
		labels := []string{}
		for k, v := range n.Labels {
			if k != corev1.LabelHostname {
				labels = append(labels, k, v)
			}
		}
		go func() {
			if err := m.cl.Create(ctx, builder.Node(name, builder.WithLabels(labels...))); err != nil && ctx.Err() == nil {
				logf("rolling: creating replacement node %s: %v", name, err)
			}
		}()
	}
}

func (m *nodeMonitor) unavailable(group string) int {
	n := 0
	for name, node := range m.all {
		if node.Labels["group"] != group || !m.seenReady[name] {
			continue
		}
		if up, _ := budget.Unavailable(node, nil); up || node.Spec.Unschedulable {
			n++
		}
	}
	return n
}

func (m *nodeMonitor) result(group string) (maxUnavailable, violations int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxUnav[group], m.violations[group]
}

// waitGone waits until no old node of the group is left.
func (m *nodeMonitor) waitGone(ctx context.Context, group string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		m.mu.Lock()
		left := 0
		for name, n := range m.all {
			if n.Labels["group"] == group && strings.Contains(name, "-old-") {
				left++
			}
		}
		m.mu.Unlock()
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d old nodes of %s left: %w", left, group, ctx.Err())
		case <-m.changed:
		}
	}
}

func rollingTable(r *rollingResult) *bench.Table {
	if r == nil {
		return nil
	}
	t := &bench.Table{
		Title: fmt.Sprintf("6. Rolling replacement: %d nodes replaced under a node budget of maxUnavailable %d, %d Deployments × %d replicas under minAvailable %d PDBs (kwok pod-fast)",
			r.Nodes, rollingBudget, r.Apps, r.Replicas, r.Replicas-1),
		Header: []string{"drainer", "total time", "most nodes unavailable at once", "node budget exceeded", "fewest Ready pods of a Deployment", "PDB broken",
			"eviction requests (429)", "API requests"},
	}
	for g, name := range []string{fmt.Sprintf("script: `kubectl drain` + `kubectl delete node`, %d at a time", rollingBudget),
		fmt.Sprintf("nodeguard: all %d `kubectl delete node` at once, denied ones retried every %s", r.Nodes, rollingRetry)} {
		t.AddRow(name, bench.Seconds(r.Total[g]), fmt.Sprint(r.MaxUnavailable[g]), fmt.Sprintf("%d times", r.NodeViolations[g]),
			fmt.Sprint(r.MinHealthy[g]), fmt.Sprintf("%d times", r.PDBViolations[g]),
			fmt.Sprintf("%d (%d)", r.API[g].evictionRequests(), r.API[g].Evictions[429]), fmt.Sprint(r.API[g].total()))
	}
	t.Note("How to read it: an upgrade as a platform engineer runs it. Both groups run at once in the same cluster, each on its own %d nodes with its own Deployments; total time runs until the last old node is gone. Both violation columns must read 0 times; then the shorter total time wins.", r.Nodes)
	t.Note("A helper plays the autoscaler for both: as soon as an old node is gone it creates a replacement with the same labels. A node counts as unavailable when cordoned, deleting, NotReady or tainted (the node budget's reading, plus cordoned), from its first Ready on; \"exceeded\" counts the times more than %d were unavailable at once, from a watch of the nodes. A PDB is broken when a Deployment's Ready, not-deleting pods drop below minAvailable (%d), from a watch of the pods.", rollingBudget, r.Replicas-1)
	t.Note("nodeguard's webhook denied %d deletes (429: the budget allowed none at that moment), each retried by the driver; API requests count what each drainer sent through its own counting proxy (nodeguard: the controller and webhook's reads and writes, not the driver's deletes; the script: every kubectl process). By kind, nodeguard: %s; the script: %s.", r.Denied, topRequests(r.API[1], 8), topRequests(r.API[0], 8))
	return t
}
