package main

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The two drainers, each with a namespace and a node of its own.
const (
	kubectlNS   = "kubectl"
	nodeguardNS = "nodeguard"
	// drainLabel selects every pod of the drain section, for the tracker.
	drainLabel = "bench.nodeguard.io/drain"
)

// drainResult is one profile's drain comparison.
type drainResult struct {
	Profile         string                     `json:"profile"`
	PodsPerNode     int                        `json:"podsPerNode"`
	KubectlEmpty    time.Duration              `json:"kubectlEmpty"`
	KubectlExit     time.Duration              `json:"kubectlExit"`
	NodeguardEmpty  time.Duration              `json:"nodeguardEmpty"`
	NodeguardGone   time.Duration              `json:"nodeguardNodeReleased"`
	Ratio           float64                    `json:"ratioKubectlOverNodeguard"`
	Cycle           time.Duration              `json:"evictionToPDBAllowsAgainP50"`
	ReadyCycle      time.Duration              `json:"evictionToReplacementReadyP50"`
	Cycles          int                        `json:"cyclesMeasured"`
	Chain           int                        `json:"longestPDBChain"`
	LowerBound      time.Duration              `json:"lowerBound"`
	Evictions       [2]int                     `json:"evictionRequests"` // kubectl, nodeguard
	TooMany         [2]int                     `json:"evictions429"`
	KubectlOutput   int                        `json:"kubectl429FromOutput"`
	MaxUnavailable  [2]int                     `json:"maxUnavailablePerPDB"`
	MaxInFlight     [2]int                     `json:"maxEvictionsInFlightPerPDB"`
	Budget          int                        `json:"budget"`
	FirstEviction   [2]time.Duration           `json:"firstEviction"`
	Evicts          [2][]harness.Eviction      `json:"evictionLog"`
	OwnChain        [2]time.Duration           `json:"longestPDBSumOfCycles"`
	Wakeup          [2]bench.Summary           `json:"wakeupDelay"` // kubectl, nodeguard
	Controllers     [2][]controllerLoad        `json:"controllerLoad"`
	PDBOpened       map[string][]time.Duration `json:"pdbAllowsAgain"`
	Healthy         map[string][]bench.Point   `json:"healthyTimelines"`
	KubectlTimeline []bench.Point              `json:"kubectlTimeline"`
	NodeguardLine   []bench.Point              `json:"nodeguardTimeline"`
}

func protectedApps(c config) []string {
	var apps []string
	for i := range c.drainApps {
		apps = append(apps, fmt.Sprintf("pdb-%c", 'a'+i))
	}
	return apps
}

// runDrain drains two identical nodes at once: one with kubectl drain, one by
// deleting it under nodeguard.
func runDrain(ctx context.Context, c config, env *harness.Env, profile string) (*drainResult, error) {
	cl := env.Client
	apps := protectedApps(c)
	replicas := map[string]int{}
	var emuNodes []armemulator.Node
	nodeFor := func(ns, name string, index int) *corev1.Node {
		ip := fmt.Sprintf("10.%d.0.%d", 10+len(ns), index+4)
		opts := []builder.NodeOption{builder.WithLabels("group", ns), builder.WithInternalIP(ip), builder.WithProviderID(vmssID("drain", index))}
		if ns == nodeguardNS {
			opts = append(opts, builder.WithLabels(managedLabel, "true"))
			emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: vmssID("drain", index)})
		}
		return builder.Node(name, opts...)
	}
	logf("drain %s: creating two nodes with %d pods each", profile, c.drainApps*c.drainReplicas+c.drainFree)
	for _, ns := range []string{kubectlNS, nodeguardNS} {
		if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
		if err := create(ctx, cl, nodeFor(ns, ns+"-target", 0)); err != nil {
			return nil, err
		}
		for _, app := range apps {
			if err := create(ctx, cl, drainDeployment(ns, app, c.drainReplicas)); err != nil {
				return nil, err
			}
			if err := create(ctx, cl, builder.PDB(ns, app, builder.MaxUnavailable("1"))); err != nil {
				return nil, err
			}
			replicas[ns+"/"+app] = c.drainReplicas
		}
		if err := create(ctx, cl, drainDeployment(ns, "free", c.drainFree)); err != nil {
			return nil, err
		}
	}
	perNode := c.drainApps*c.drainReplicas + c.drainFree
	for _, ns := range []string{kubectlNS, nodeguardNS} {
		if err := waitReadyOn(ctx, cl, ns, ns+"-target", perNode); err != nil {
			return nil, err
		}
	}
	// Spare nodes take the replacements; created now so that the initial pods
	// all landed on the targets.
	for _, ns := range []string{kubectlNS, nodeguardNS} {
		for i := range 2 {
			if err := create(ctx, cl, nodeFor(ns, fmt.Sprintf("%s-spare-%d", ns, i), i+1)); err != nil {
				return nil, err
			}
		}
	}
	if err := harness.Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, ns := range []string{kubectlNS, nodeguardNS} {
			for _, app := range apps {
				var pdb policyv1.PodDisruptionBudget
				if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: app}, &pdb); err != nil ||
					pdb.Status.CurrentHealthy != int32(c.drainReplicas) || pdb.Status.DisruptionsAllowed != 1 {
					return false, err
				}
			}
		}
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for every PDB to allow 1 disruption: %w", err)
	}

	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{Internal: true}), armemulator.Options{})
	if err != nil {
		return nil, err
	}
	defer emu.Close()
	proxy, err := startAPIProxy(env, env.Dir, "drain-proxy")
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	ng, err := startNodeguard(c.nodeguard, env, proxy.Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-drain.log"))
	if err != nil {
		return nil, err
	}
	defer ng.stop()
	target := nodeguardNS + "-target"
	if err := waitFinalizer(ctx, cl, target); err != nil {
		return nil, err
	}
	tr, err := startPodTracker(ctx, env.Config, drainLabel+"=true", replicas)
	if err != nil {
		return nil, err
	}
	pw, err := startPDBWatch(ctx, env.Config, kubectlNS, nodeguardNS)
	if err != nil {
		return nil, err
	}

	logf("drain %s: kubectl drain %s-target and kubectl delete node %s, at once", profile, kubectlNS, target)
	start := tr.begin(kubectlNS+"-target", target)
	var wg sync.WaitGroup
	var kubectlOut []byte
	var kubectlErr, deleteErr error
	var kubectlExit time.Duration
	wg.Add(2)
	go func() {
		defer wg.Done()
		cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", proxy.Kubeconfig, "drain", kubectlNS+"-target",
			"--ignore-daemonsets", "--delete-emptydir-data", "--timeout=15m")
		kubectlOut, kubectlErr = cmd.CombinedOutput()
		kubectlExit = time.Since(start)
	}()
	go func() {
		defer wg.Done()
		out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig, "delete", "node", target, "--wait=false").CombinedOutput()
		if err != nil {
			deleteErr = fmt.Errorf("kubectl delete node: %v: %s", err, out)
		}
	}()
	var gone time.Duration
	err = harness.Poll(ctx, 15*time.Minute, func(ctx context.Context) (bool, error) {
		if gone == 0 {
			if err := cl.Get(ctx, client.ObjectKey{Name: target}, &corev1.Node{}); client.IgnoreNotFound(err) == nil && err != nil {
				gone = time.Since(start)
			}
		}
		return gone > 0 && tr.left(kubectlNS+"-target") == 0 && tr.left(target) == 0, nil
	})
	wg.Wait()
	if deleteErr != nil {
		return nil, deleteErr
	}
	if kubectlErr != nil {
		return nil, fmt.Errorf("kubectl drain: %v: %s", kubectlErr, kubectlOut)
	}
	if err != nil {
		return nil, fmt.Errorf("waiting for both nodes to be empty (kubectl %d pods left, nodeguard %d): %w", tr.left(kubectlNS+"-target"), tr.left(target), err)
	}

	r := &drainResult{Profile: profile, PodsPerNode: perNode, NodeguardGone: gone, KubectlExit: kubectlExit, Budget: 1,
		KubectlTimeline: tr.timeline(kubectlNS + "-target"), NodeguardLine: tr.timeline(target)}
	r.KubectlEmpty = emptyAt(r.KubectlTimeline)
	r.NodeguardEmpty = emptyAt(r.NodeguardLine)
	r.Ratio = bench.Ratio(r.KubectlEmpty, r.NodeguardEmpty)
	var cycles, readyCycles []time.Duration
	var chains []int
	for _, ns := range []string{kubectlNS, nodeguardNS} {
		for _, app := range apps {
			cycles = append(cycles, pw.cycles(proxy.Evictions(ns), ns, app)...)
			readyCycles = append(readyCycles, bench.Dips(tr.healthyTimeline(ns+"/"+app), c.drainReplicas)...)
			chains = append(chains, bench.ChainLength(c.drainReplicas, 1))
		}
	}
	r.Cycle, r.Cycles = bench.Percentile(cycles, 50), len(cycles)
	r.ReadyCycle = bench.Percentile(readyCycles, 50)
	r.Chain = slices.Max(chains)
	r.LowerBound = bench.LowerBound(chains, r.Cycle)
	r.Healthy = map[string][]bench.Point{}
	r.PDBOpened = map[string][]time.Duration{}
	for i, ns := range []string{kubectlNS, nodeguardNS} {
		if t := firstEviction(proxy, ns); !t.IsZero() {
			r.FirstEviction[i] = t.Sub(start)
		}
		r.Evicts[i] = proxy.Evictions(ns)
		for _, app := range apps {
			r.Healthy[ns+"/"+app] = tr.healthyTimeline(ns + "/" + app)
			var sum time.Duration
			for _, d := range pw.cycles(r.Evicts[i], ns, app) {
				sum += d
			}
			r.OwnChain[i] = max(r.OwnChain[i], sum)
		}
		r.Wakeup[i] = bench.Summarize(pw.wakeups(r.Evicts[i], ns, apps))
		for _, app := range apps {
			r.PDBOpened[ns+"/"+app] = pw.since(ns+"/"+app, start)
		}
		if empty := []time.Duration{r.KubectlEmpty, r.NodeguardEmpty}[i]; env.AuditLog != "" && r.FirstEviction[i] > 0 && empty > r.FirstEviction[i] {
			if r.Controllers[i], err = controllerLoads(env.AuditLog, ns, start.Add(r.FirstEviction[i]), start.Add(empty)); err != nil {
				return nil, err
			}
		}
		r.Evictions[i] = evictionsAnswered(proxy, ns, 0)
		r.TooMany[i] = evictionsAnswered(proxy, ns, 429)
		r.MaxInFlight[i] = maxInFlight(proxy, ns, apps)
		for _, app := range apps {
			r.MaxUnavailable[i] = max(r.MaxUnavailable[i], tr.maxUnavailable(ns+"/"+app))
		}
	}
	logf("drain %s: nodeguard made %d drain passes, %d event writes, %d node writes", profile, proxy.PassesOf(target),
		len(proxy.Writes("", "/apis/events.k8s.io/")), len(proxy.Writes("", "/api/v1/nodes/"+target)))
	r.KubectlOutput = strings.Count(string(kubectlOut), "Cannot evict pod as it would violate the pod's disruption budget")
	logf("drain %s: kubectl %s, nodeguard %s (ratio %.2f), lower bound %s", profile,
		bench.Seconds(r.KubectlEmpty), bench.Seconds(r.NodeguardEmpty), r.Ratio, bench.Seconds(r.LowerBound))
	return r, nil
}

// emptyAt is when a node's pod count last reached zero.
func emptyAt(pts []bench.Point) time.Duration {
	if len(pts) == 0 || pts[len(pts)-1].V != 0 {
		return 0
	}
	return pts[len(pts)-1].T
}

func drainDeployment(ns, app string, replicas int) client.Object {
	d := builder.Deployment(ns, app, int32(replicas), builder.OnNodes("group", ns))
	d.Spec.Template.Labels[drainLabel] = "true"
	return d
}

func vmssID(set string, index int) string {
	return fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%d",
		subscription, resourceGroup, set, index)
}

func create(ctx context.Context, cl client.Client, obj client.Object) error {
	if err := cl.Create(ctx, obj); err != nil {
		return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// waitReadyOn waits until want pods of the namespace are Ready on the node
// (on any node when node is "").
func waitReadyOn(ctx context.Context, cl client.Client, ns, node string, want int) error {
	n := 0
	err := harness.Poll(ctx, 5*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		n = 0
		for i := range pods.Items {
			if (node == "" || pods.Items[i].Spec.NodeName == node) && podReady(&pods.Items[i]) {
				n++
			}
		}
		return n == want, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d pods of %s Ready on %q: %w", n, want, ns, node, err)
	}
	return nil
}

// waitFinalizer waits until nodeguard's finalizer is on the node and its
// few-second hold after adding it has passed.
func waitFinalizer(ctx context.Context, cl client.Client, node string) error {
	return harness.Poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := cl.Get(ctx, client.ObjectKey{Name: node}, &n)
		_, justAdded := n.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
		return err == nil && slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) && !justAdded, err
	})
}

func drainTable(rs []*drainResult) *bench.Table {
	if len(rs) == 0 {
		return nil
	}
	t := &bench.Table{
		Title: "1. Drain: kubectl drain vs nodeguard (same workload, same cluster, at once)",
		Header: []string{"kwok pods", "pods/node", "kubectl drain", "nodeguard", "speed-up", "lower bound", "nodeguard / bound",
			"429s kubectl", "429s nodeguard", "PDB allows → next eviction p50 / p99 kubectl", "PDB allows → next eviction p50 / p99 nodeguard",
			"max unavailable/PDB (budget 1) kubectl, nodeguard", "max evictions in flight/PDB kubectl, nodeguard"},
	}
	for _, r := range rs {
		t.AddRow(r.Profile, fmt.Sprint(r.PodsPerNode), bench.Seconds(r.KubectlEmpty), bench.Seconds(r.NodeguardEmpty), bench.Times(r.Ratio),
			bench.Seconds(r.LowerBound), bench.Times(bench.Ratio(r.NodeguardEmpty, r.LowerBound)),
			fmt.Sprintf("%d of %d", r.TooMany[0], r.Evictions[0]), fmt.Sprintf("%d of %d", r.TooMany[1], r.Evictions[1]),
			wakeupCell(r.Wakeup[0]), wakeupCell(r.Wakeup[1]),
			fmt.Sprintf("%d, %d", r.MaxUnavailable[0], r.MaxUnavailable[1]), fmt.Sprintf("%d, %d", r.MaxInFlight[0], r.MaxInFlight[1]))
	}
	t.Note("Times run from the start (kubectl drain started; kubectl delete node issued) until the last pod object on the node is gone. nodeguard's time includes the maintenance Lease, cordon, draining taint and AdminState Down through the ARM emulator.")
	t.Note("PDB allows → next eviction (the wake-up delay): from each moment a PDB went from allowing no disruption to allowing one, as the benchmark's own watch of the PDBs delivers it, to the drainer's eviction request that used it, at the proxy (the k-th such change pairs with the drainer's (k+1)-th granted eviction of that PDB: budget 1). kubectl drain retries every 5 s; nodeguard's parked queue is woken by the status change (its own view of the same delay is the metric nodeguard_drain_wakeup_delay_seconds). A request that beat the benchmark's watch counts 0.")
	t.Note("Lower bound = longest PDB chain (pods of one PDB on the node ÷ disruptions allowed) × the median budget cycle of the same run (both nodes pooled): from an eviction request the PDB granted until the PDB allowed a disruption again (the eviction, the replacement becoming Ready, the disruption controller's status update), the least any drainer must wait between two evictions of a PDB with a budget of 1. Under pod-general a cycle is 1–6 s at random, so the bound is an estimate and a ratio near 1.0× means at the bound; the exact figure per drainer is its own longest PDB's sum of cycles, in the notes.")
	for _, r := range rs {
		t.Note("%s: chain %d × cycle %s (median of %d; eviction to replacement Ready alone: median %s) = %s; the longest PDB's own cycles summed to %s (kubectl) and %s (nodeguard); first eviction request after %s (kubectl) and %s (nodeguard: Lease, cordon, taint, traffic cut); nodeguard's node released (finalizer removed) at %s; kubectl drain exited at %s and printed %d PDB refusals.",
			r.Profile, r.Chain, bench.Millis(r.Cycle), r.Cycles, bench.Millis(r.ReadyCycle), bench.Seconds(r.LowerBound), bench.Seconds(r.OwnChain[0]), bench.Seconds(r.OwnChain[1]), bench.Millis(r.FirstEviction[0]), bench.Millis(r.FirstEviction[1]),
			bench.Seconds(r.NodeguardGone), bench.Seconds(r.KubectlExit), r.KubectlOutput)
		t.Note("%s: kube-controller-manager's writes in the drain namespaces while each drainer drained, from its first eviction until its node was empty (both drainers' pods share each controller's client and its limit of %d/s): nodeguard: %s; kubectl: %s.",
			r.Profile, kcmClientQPS, loadCell(r.Controllers[1]), loadCell(r.Controllers[0]))
	}
	return t
}

func wakeupCell(s bench.Summary) string {
	if s.N == 0 {
		return "none"
	}
	return fmt.Sprintf("%s / %s (n %d)", bench.Millis(s.P50), bench.Millis(s.P99), s.N)
}

func drainPanels(rs []*drainResult) []bench.Panel {
	var ps []bench.Panel
	for _, r := range rs {
		ps = append(ps, bench.Panel{
			Title:  fmt.Sprintf("kwok %s: kubectl drain %s, nodeguard %s (%.1f× faster)", r.Profile, bench.Seconds(r.KubectlEmpty), bench.Seconds(r.NodeguardEmpty), r.Ratio),
			YLabel: "pods on the node",
			Series: []bench.Series{
				{Name: "kubectl drain", Color: "#d62728", Points: r.KubectlTimeline},
				{Name: "nodeguard", Color: "#1f77b4", Points: r.NodeguardLine},
			},
			Marker: r.LowerBound, MarkerLabel: "lower bound",
		})
	}
	return ps
}

// pdbWatch records, from its own watch, when each PDB of the drain section
// went from allowing no disruption to allowing one: the moments a drainer
// whose queue waits on that PDB can send its next eviction.
type pdbWatch struct {
	mu      sync.Mutex
	start   time.Time
	allowed map[string]int32       // ns/name → disruptionsAllowed last seen
	opened  map[string][]time.Time // ns/name → when it went from 0 to more
}

func startPDBWatch(ctx context.Context, cfg *rest.Config, namespaces ...string) (*pdbWatch, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	w := &pdbWatch{allowed: map[string]int32{}, opened: map[string][]time.Time{}}
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
		inf := f.Policy().V1().PodDisruptionBudgets().Informer()
		if err := watchSynced(ctx, f, inf, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.observe(obj) },
			UpdateFunc: func(_, obj any) { w.observe(obj) },
		}); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (w *pdbWatch) observe(obj any) {
	pdb, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return
	}
	now := time.Now()
	key := pdb.Namespace + "/" + pdb.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, seen := w.allowed[key]; seen && prev == 0 && pdb.Status.DisruptionsAllowed > 0 {
		w.opened[key] = append(w.opened[key], now)
	}
	w.allowed[key] = pdb.Status.DisruptionsAllowed
}

// since is when the PDB went from allowing no disruption to allowing one,
// counted from start.
func (w *pdbWatch) since(key string, start time.Time) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Duration
	for _, t := range w.opened[key] {
		out = append(out, t.Sub(start))
	}
	return out
}

// cycles are the PDB's budget cycles: from each eviction request the PDB
// granted to the moment it allowed a disruption again, the least any drainer
// must wait between two evictions under a budget of 1: the eviction itself,
// the pod's replacement becoming Ready and the disruption controller's status
// update. Each grant pairs with the first change to allowing after it.
func (w *pdbWatch) cycles(evictions []harness.Eviction, ns, app string) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	opened := w.opened[ns+"/"+app]
	var out []time.Duration
	for _, e := range evictions {
		if e.Workload != app || e.Status != http.StatusCreated {
			continue
		}
		if k := slices.IndexFunc(opened, func(t time.Time) bool { return t.After(e.Start) }); k >= 0 {
			out = append(out, opened[k].Sub(e.Start))
		}
	}
	return out
}

// wakeups are, for each time a PDB of the namespace went from allowing no
// disruption to allowing one, the delay until the drainer's eviction request
// that used it. Under a budget of 1 each such change lets exactly one
// eviction through, so the k-th change pairs with the eviction answered 201
// after the first (which used the budget the PDB started with). Both times
// are taken here, the status change as this watch delivers it and the
// request as the proxy forwards it; a request that beat the benchmark's watch
// counts 0.
func (w *pdbWatch) wakeups(evictions []harness.Eviction, ns string, apps []string) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Duration
	for _, app := range apps {
		var granted []time.Time
		for _, e := range evictions {
			if e.Workload == app && e.Status == http.StatusCreated {
				granted = append(granted, e.Start)
			}
		}
		slices.SortFunc(granted, func(a, b time.Time) int { return a.Compare(b) })
		for k, t := range w.opened[ns+"/"+app] {
			if k+1 < len(granted) {
				out = append(out, max(granted[k+1].Sub(t), 0))
			}
		}
	}
	return out
}
