package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Processes sampled in the scale section: nodeguard and, as comparators,
// the stock controllers that watch the same nodes and pods.
var scaleProcs = []string{"nodeguard", "kube-controller-manager", "kube-scheduler"}

type scaleResult struct {
	Nodes, Pods    int
	DeploymentPods int `json:"deploymentPods"`
	// Stragglers are the pods that were not running when the run went on.
	Stragglers int `json:"stragglers"`
	// Deleted nodes per drainer; Parallel is nodeguard's default
	// --max-concurrent-drains, which the kubectl loop matches.
	Deleted   int            `json:"deleted"`
	Parallel  int            `json:"parallel"`
	Nodeguard *fleetDeletion `json:"nodeguard,omitempty"`
	Kubectl   *fleetDeletion `json:"kubectl,omitempty"`
	// Bound is the fleet deletion's lower bound (fleetbound.go).
	Bound  *fleetBound  `json:"bound,omitempty"`
	Phases []scalePhase `json:"phases"`
	// Idle is nodeguard's idle RSS with a tenth of the nodes and pods, then
	// with all: the growth per node between them.
	Idle []idlePoint `json:"idle"`
}

// idlePoint is nodeguard's RSS in an idle window of the cluster: the
// 1-second samples, their median (RSS) and their peak. The median is the
// steadier figure: the peak is one sample, wherever the Go collector's
// pacing put it.
type idlePoint struct {
	Nodes, Pods int
	RSS         int64   `json:"medianRSSBytes"`
	Peak        int64   `json:"peakRSSBytes"`
	Samples     []int64 `json:"rssSamplesBytes,omitempty"`
}

// newIdlePoint summarizes an idle window's samples (at least
// minIdleSamples: fewer, and the peak stands in for the median).
func newIdlePoint(nodes, pods int, samples []int64, peak int64) idlePoint {
	p := idlePoint{Nodes: nodes, Pods: pods, RSS: peak, Peak: peak, Samples: samples}
	if len(samples) >= minIdleSamples {
		sorted := slices.Sorted(slices.Values(samples))
		p.RSS = sorted[len(sorted)/2]
	}
	return p
}

const minIdleSamples = 3

// spread says how many samples the point has and their range.
func (p idlePoint) spread() string {
	if len(p.Samples) < minIdleSamples {
		return "the peak, too few samples"
	}
	return fmt.Sprintf("%d samples, %s–%s", len(p.Samples), mib(slices.Min(p.Samples)), mib(slices.Max(p.Samples)))
}

// rssPerThousandNodes is how much nodeguard's idle RSS (the windows'
// medians) grew per 1,000 nodes (and their pods) between the first and the
// last idle point.
func (r *scaleResult) rssPerThousandNodes() (float64, bool) {
	if len(r.Idle) < 2 {
		return 0, false
	}
	a, b := r.Idle[0], r.Idle[len(r.Idle)-1]
	if b.Nodes <= a.Nodes {
		return 0, false
	}
	return float64(b.RSS-a.RSS) / float64(b.Nodes-a.Nodes) * 1000, true
}

// scalePhase is one window: per process, peak RSS and average CPU.
type scalePhase struct {
	Name     string             `json:"name"`
	Duration time.Duration      `json:"duration"`
	RSS      map[string]int64   `json:"peakRSSBytes"`
	CPU      map[string]float64 `json:"cpuCores"`
	// samples are the window's RSS samples per process (not kept in results).
	samples map[string][]int64
}

// sampler reads /proc for the processes every second.
type sampler struct {
	mu   sync.Mutex
	pids map[string]int
	peak map[string]int64
	// series are the RSS samples of the current window.
	series map[string][]int64
}

func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sampler) sample() map[string]procSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]procSample{}
	for name, pid := range s.pids {
		if ps, err := readProc(pid); err == nil {
			out[name] = ps
			s.peak[name] = max(s.peak[name], ps.RSS)
			if s.series != nil {
				s.series[name] = append(s.series[name], ps.RSS)
			}
		}
	}
	return out
}

// window measures a phase: it resets the peaks, runs fn, and returns the
// peak RSS and average CPU of each process over it.
func (s *sampler) window(name string, fn func() error) (scalePhase, error) {
	s.mu.Lock()
	s.peak, s.series = map[string]int64{}, map[string][]int64{}
	s.mu.Unlock()
	before := s.sample()
	start := time.Now()
	err := fn()
	after := s.sample()
	p := scalePhase{Name: name, Duration: time.Since(start), RSS: map[string]int64{}, CPU: map[string]float64{}, samples: s.series}
	s.mu.Lock()
	for n := range s.pids {
		p.RSS[n] = s.peak[n]
		p.CPU[n] = float64(after[n].CPU-before[n].CPU) / float64(after[n].At.Sub(before[n].At))
	}
	s.mu.Unlock()
	return p, err
}

// runScale measures nodeguard's footprint with many kwok nodes and pods, idle
// and while nodes are deleted, and the fleet deletion itself against a
// kubectl drain loop. Most pods are created bound to their nodes (no
// scheduler, no ReplicaSet controller: the stock controllers' client rate
// limits would take far longer than the measurement); a tenth belong to
// Deployments under PDBs, so drains go through the budgets.
func runScale(ctx context.Context, c config, env *harness.Env) (*scaleResult, error) {
	r := &scaleResult{Nodes: c.scaleNodes, Pods: c.scalePods, Deleted: c.scaleDelete, Parallel: min(finalizer.DefaultMaxConcurrentNodes, c.scaleDelete)}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 2000, 2000
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	names, candidates := scaleNodeNames(c)
	var emuNodes []armemulator.Node
	for i, name := range names {
		emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{nodeIP(i)}})
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{Internal: true}), armemulator.Options{})
	if err != nil {
		return nil, err
	}
	defer emu.Close()
	ngAPI, err := startRequestCounter(env.Config, filepath.Join(env.Dir, "scale-nodeguard.kubeconfig"))
	if err != nil {
		return nil, err
	}
	defer ngAPI.close()
	kubectlAPI, err := startRequestCounter(env.Config, filepath.Join(env.Dir, "scale-kubectl.kubeconfig"))
	if err != nil {
		return nil, err
	}
	defer kubectlAPI.close()
	metricsAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	ng, err := startNodeguard(c.nodeguard, env, ngAPI.Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-scale.log"),
		"--metrics-bind-address="+metricsAddr, "--metrics-secure=false")
	if err != nil {
		return nil, err
	}
	metricsURL := "http://" + metricsAddr + "/metrics"
	defer ng.stop()
	s := &sampler{pids: map[string]int{"nodeguard": ng.pid()}, peak: map[string]int64{}}
	for _, p := range scaleProcs[1:] {
		if pid := childPID(p); pid > 0 {
			s.pids[p] = pid
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.run(sctx)
	phase := func(name string, fn func() error) error {
		p, err := s.window(name, fn)
		r.Phases = append(r.Phases, p)
		return err
	}
	idle := func(name string) error {
		return phase(name, func() error {
			select {
			case <-time.After(c.scaleIdle):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}
	if err := idle("empty cluster, idle"); err != nil {
		return r, err
	}
	if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNS}}); err != nil {
		return r, err
	}
	deployments := max(c.scalePods/10/100, 1)
	r.DeploymentPods = deployments * scaleReplicas
	bare := c.scalePods - r.DeploymentPods
	// A tenth of the nodes with their bare pods first, idle, then the rest
	// and the Deployments: nodeguard's idle RSS at both sizes gives its
	// growth per node. The Deployments come last, so that their pods spread
	// over every node as before.
	first := c.scaleNodes / 10
	idlePoint := func(nodes, pods int) error {
		if err := idle(idlePhase(nodes, pods)); err != nil {
			return err
		}
		p := r.Phases[len(r.Phases)-1]
		r.Idle = append(r.Idle, newIdlePoint(nodes, pods, p.samples["nodeguard"], p.RSS["nodeguard"]))
		return nil
	}
	if first > 0 {
		firstPods := barePodsOn(bare, len(names), func(n int) bool { return n < first })
		logf("scale: creating %d nodes and %d pods", first, len(firstPods))
		if err := phase(fmt.Sprintf("creating %d nodes", first), func() error { return createScaleNodes(ctx, cl, names[:first], candidates) }); err != nil {
			return r, err
		}
		if err := phase(fmt.Sprintf("creating %d pods", len(firstPods)), func() error {
			if err := createBarePods(ctx, cl, names, firstPods); err != nil {
				return err
			}
			_, err := waitRunning(ctx, cl, scaleNS, 0, len(firstPods))
			return err
		}); err != nil {
			return r, err
		}
		if err := idlePoint(first, len(firstPods)); err != nil {
			return r, err
		}
	}
	logf("scale: creating %d nodes", c.scaleNodes-first)
	if err := phase(fmt.Sprintf("creating %d more nodes", c.scaleNodes-first), func() error { return createScaleNodes(ctx, cl, names, candidates) }); err != nil {
		return r, err
	}
	rest := barePodsOn(bare, len(names), func(n int) bool { return n >= first })
	logf("scale: creating %d pods", len(rest)+r.DeploymentPods)
	if err := phase(fmt.Sprintf("creating %d more pods", len(rest)+r.DeploymentPods), func() error {
		var err error
		r.Stragglers, err = createScalePods(ctx, cl, names, deployments, rest, bare)
		return err
	}); err != nil {
		return r, err
	}
	if err := idlePoint(c.scaleNodes, c.scalePods); err != nil {
		return r, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return r, err
	}
	writes, err := startRSWrites(ctx, cs)
	if err != nil {
		return r, err
	}
	// The candidates are cordoned while the cycles are measured: no
	// replacement lands on them and changes the sets' pods.
	logf("scale: %d idle replacement cycles", c.scaleCycles)
	r.Bound = &fleetBound{WritesPerPod: map[string]float64{}}
	if err := setSchedulable(ctx, cl, candidates, false); err != nil {
		return r, err
	}
	if r.Bound.Cycles, err = fleetCycles(ctx, cl, cs, c.scaleCycles, deployments, candidates); err != nil {
		return r, err
	}
	if err := setSchedulable(ctx, cl, candidates, true); err != nil {
		return r, err
	}
	probe := fleetProbe(c)
	logf("scale: the cluster's eviction rate, %d bursts of %d bare pods, %d at a time", probe.rounds, probe.pods, probe.workers)
	if r.Bound.EvictionRates, err = evictionRates(ctx, env, cl, names[len(candidates):], probe); err != nil {
		return r, err
	}
	ngSet, kubectlSet, err := splitSets(ctx, cl, candidates, c.scaleDelete)
	if err != nil {
		return r, fmt.Errorf("splitting the deleted nodes into two sets: %w", err)
	}
	if err := create(ctx, cl, builder.NDB("scale", builder.NDBSelecting(managedLabel, "true"), builder.NDBMaxUnavailable(scaleNDB))); err != nil {
		return r, err
	}
	budgets, err := startBudgetWatch(ctx, env, deployments)
	if err != nil {
		return r, err
	}
	// The kubectl set is cordoned while nodeguard deletes its own, so that
	// both sets keep the pods they started with.
	if err := setSchedulable(ctx, cl, kubectlSet, false); err != nil {
		return r, err
	}

	logf("scale: deleting %d nodes at once under nodeguard (NDB maxUnavailable %s)", len(ngSet), scaleNDB)
	available, err := availableReplicas(ctx, cl, scaleNS)
	if err != nil {
		return r, err
	}
	if err := budgetsWhole(available); err != nil {
		return r, err
	}
	writes.begin()
	if err := phase(nodeguardDeletionPhase(len(ngSet)), func() error {
		var err error
		budgets.begin()
		r.Nodeguard, err = deleteWithNodeguard(ctx, cl, ngAPI, metricsURL, ngSet)
		if r.Nodeguard != nil {
			r.Nodeguard.Budgets = budgets.result()
		}
		return err
	}); err != nil {
		return r, err
	}
	if err := waitDeploymentsBack(ctx, cl, scaleNS, available); err != nil {
		return r, err
	}
	r.Bound.WritesPerPod["nodeguard"] = writes.end()
	logf("scale: nodeguard released %d nodes in %s; kubectl drain loop on %d nodes, %d at a time", len(ngSet), bench.Seconds(r.Nodeguard.Released), len(kubectlSet), r.Parallel)
	writes.begin()
	if err := phase(fmt.Sprintf("draining and deleting %d nodes (kubectl loop)", len(kubectlSet)), func() error {
		var err error
		budgets.begin()
		r.Kubectl, err = drainWithKubectl(ctx, cl, kubectlAPI, kubectlSet, r.Parallel)
		if r.Kubectl != nil {
			r.Kubectl.Budgets = budgets.result()
		}
		return err
	}); err != nil {
		return r, err
	}
	if err := waitDeploymentsBack(ctx, cl, scaleNS, available); err != nil {
		return r, err
	}
	r.Bound.WritesPerPod["kubectl"] = writes.end()
	r.Bound.compute(r.Nodeguard.PerApp, r.Nodeguard.Total)
	logf("scale: kubectl loop released %d nodes in %s", len(kubectlSet), bench.Seconds(r.Kubectl.Released))
	return r, nil
}

// budgetsWhole fails a fleet run that would start with a Deployment already
// past its PDB's budget: that PDB allows no eviction, and the drains would
// wait for pods that never turn Ready instead of measuring anything.
func budgetsWhole(available map[string]int32) error {
	var spent []string
	for _, name := range slices.Sorted(maps.Keys(available)) {
		if missing := scaleReplicas - int(available[name]); missing >= scaleBudget {
			spent = append(spent, fmt.Sprintf("%s (%d of %d unavailable)", name, missing, scaleReplicas))
		}
	}
	if len(spent) > 0 {
		return fmt.Errorf("before the deletions, the PDBs of %s allow no disruption (budget %d): pods that never turned Ready (kwok's Ready left stale after a missed heartbeat?)",
			strings.Join(spent, ", "), scaleBudget)
	}
	return nil
}

// idlePhase and nodeguardDeletionPhase name the phases the summary table of
// docs/performance.md reads nodeguard's RSS from.
func idlePhase(nodes, pods int) string { return fmt.Sprintf("%d nodes, %d pods, idle", nodes, pods) }

func nodeguardDeletionPhase(nodes int) string {
	return fmt.Sprintf("deleting %d nodes (nodeguard)", nodes)
}

const (
	// scaleKwokParallelism is how many pod stages, node stages and node
	// Leases kwok plays at once in the scale cluster. With kwok's 4, pods
	// started at about 10 a second at 2,000 nodes on this 2-core machine
	// (40,000 would have taken over an hour) and heartbeats lagged.
	scaleKwokParallelism = 32
	// fleetNodeMonitorGracePeriod is how long the node lifecycle controller
	// of a fleet cluster (the scale and karpenter sections', startCluster)
	// waits for a node's heartbeat. At 2,000 nodes, while
	// 36,400 pods started, kwok's Leases of live nodes lagged past the usual
	// 40 s: the controller marked 1,868 pods not Ready, kwok never marked
	// them Ready again, and PDBs that counted them unhealthy held the drains
	// for good. The bench has no dead node to notice.
	fleetNodeMonitorGracePeriod = 5 * time.Minute

	scaleNS  = "scale"
	scaleNDB = "10%"
	// scaleSetLabel names the set a deleted node belongs to.
	scaleSetLabel = "bench.nodeguard.io/set"
)

// scaleNodeNames are the nodes of the run; the first of them are the
// candidates for the two deleted sets (splitSets picks them once the pods
// are placed).
func scaleNodeNames(c config) (names, candidates []string) {
	for i := range c.scaleNodes {
		names = append(names, fmt.Sprintf("scale-%04d", i))
	}
	return names, names[:min(2*c.scaleDelete, c.scaleNodes)]
}

// createScaleNodes creates the nodes of names that do not exist yet and
// waits until all of them are Ready. Every node but the candidates is
// managed by nodeguard; splitSets labels the candidates.
func createScaleNodes(ctx context.Context, cl client.Client, names, candidates []string) error {
	if err := forEach(ctx, names, 32, func(ctx context.Context, n string) error {
		i, _ := strconv.Atoi(n[len("scale-"):])
		opts := []builder.NodeOption{builder.WithInternalIP(nodeIP(i))}
		if slices.Contains(candidates, n) {
			opts = append(opts, builder.WithLabels(scaleSetLabel, candidateSet))
		} else {
			opts = append(opts, builder.WithLabels(managedLabel, "true"))
		}
		return client.IgnoreAlreadyExists(cl.Create(ctx, builder.Node(n, opts...)))
	}); err != nil {
		return err
	}
	return harness.PollEvery(ctx, 2*time.Second, 10*time.Minute, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes); err != nil {
			return false, err
		}
		ready := 0
		for i := range nodes.Items {
			if up, _ := budget.Unavailable(&nodes.Items[i], nil); !up {
				ready++
			}
		}
		return ready >= len(names), nil
	})
}

// candidateSet labels the candidates until splitSets gives each its set.
const candidateSet = "candidate"

// splitSets splits the candidates, once their pods are placed, into
// nodeguard's set and the kubectl loop's with as many Deployment pods each,
// Deployment by Deployment (the pods the PDBs gate: past a PDB's budget,
// evictions wait for replacements). The scheduler does not spread them
// evenly over the nodes: the first 100 nodes held 553 against the next
// 100's 401 in one run, 498 against 447 when the sets alternated. It
// labels nodeguard's set managed and waits until nodeguard's finalizer is
// on each of them, past the hold that denies a delete right after it.
func splitSets(ctx context.Context, cl client.Client, candidates []string, n int) (ngSet, kubectlSet []string, err error) {
	loads := make([]nodeLoad, len(candidates))
	err = forEach(ctx, candidates, 8, func(ctx context.Context, name string) error {
		pods, err := podMetaOn(ctx, cl, name)
		if err != nil {
			return err
		}
		l := nodeLoad{name: name, apps: map[string]int{}}
		for _, p := range pods {
			if app := p.Labels["app"]; app != barePodApp {
				l.apps[app]++
			}
		}
		loads[slices.Index(candidates, name)] = l
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	ngSet, kubectlSet = splitEvenly(loads, n)
	label := func(set string, managed bool) func(context.Context, string) error {
		return func(ctx context.Context, name string) error {
			labels := map[string]any{scaleSetLabel: set}
			if managed {
				labels[managedLabel] = "true"
			}
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
			return cl.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, patch))
		}
	}
	if err := forEach(ctx, ngSet, 32, label("nodeguard", true)); err != nil {
		return nil, nil, err
	}
	if err := forEach(ctx, kubectlSet, 32, label("kubectl", false)); err != nil {
		return nil, nil, err
	}
	return ngSet, kubectlSet, harness.PollEvery(ctx, time.Second, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes, client.MatchingLabels{scaleSetLabel: "nodeguard"}); err != nil {
			return false, err
		}
		guarded := 0
		for _, node := range nodes.Items {
			_, marked := node.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
			if slices.Contains(node.Finalizers, ngv1alpha1.TerminationFinalizer) && !marked {
				guarded++
			}
		}
		return guarded == len(ngSet), nil
	})
}

// nodeLoad is a candidate's Deployment pods, by Deployment.
type nodeLoad struct {
	name string
	apps map[string]int
}

func (l nodeLoad) total() int {
	t := 0
	for _, v := range l.apps {
		t += v
	}
	return t
}

// splitEvenly deals the nodes into two sets of n, the most loaded first,
// each into the set where it leaves the sets' Deployment pods closest, then
// swaps pairs between the sets while a swap brings them closer. Closeness
// is the sum over Deployments of the difference in their pods, plus twice
// the difference in all.
func splitEvenly(loads []nodeLoad, n int) (a, b []string) {
	order := slices.Clone(loads)
	slices.SortStableFunc(order, func(x, y nodeLoad) int { return y.total() - x.total() })
	var sets [2][]nodeLoad
	diff, total := map[string]int{}, 0 // set 0's pods less set 1's
	// moved is how much the imbalance changes when l's pods count sign
	// times more for set 0 against set 1 (sign ±1 adds, ±2 swaps).
	moved := func(sign int, ls ...nodeLoad) int {
		change, t := map[string]int{}, 0
		for i, l := range ls {
			s := sign
			if i == 1 {
				s = -sign
			}
			for app, v := range l.apps {
				change[app] += s * v
			}
			t += s * l.total()
		}
		d := 0
		for app, c := range change {
			d += abs(diff[app]+c) - abs(diff[app])
		}
		return d + 2*(abs(total+t)-abs(total))
	}
	apply := func(sign int, l nodeLoad) {
		for app, v := range l.apps {
			diff[app] += sign * v
		}
		total += sign * l.total()
	}
	for _, l := range order {
		into := 0
		if len(sets[0]) == n || (len(sets[1]) < n && moved(-1, l) < moved(1, l)) {
			into = 1
		}
		sets[into] = append(sets[into], l)
		apply(1-2*into, l)
	}
	for improved, rounds := true, 0; improved && rounds < 20; rounds++ {
		improved = false
		for i := range sets[0] {
			for j := range sets[1] {
				x, y := sets[0][i], sets[1][j]
				if moved(-2, x, y) < 0 {
					apply(-2, x)
					apply(2, y)
					sets[0][i], sets[1][j] = y, x
					improved = true
				}
			}
		}
	}
	for _, l := range sets[0] {
		a = append(a, l.name)
	}
	for _, l := range sets[1] {
		b = append(b, l.name)
	}
	return a, b
}

func abs(x int) int { return max(x, -x) }

// barePodsOn numbers the bare pods (of bare in all, pod i on node i mod
// nodes) that go on the nodes onNode picks.
func barePodsOn(bare, nodes int, onNode func(int) bool) []int {
	var pods []int
	for i := range bare {
		if onNode(i % nodes) {
			pods = append(pods, i)
		}
	}
	return pods
}

// createBarePods creates the numbered bare pods, pod i on node i mod nodes.
func createBarePods(ctx context.Context, cl client.Client, names []string, pods []int) error {
	podNames := make([]string, 0, len(pods))
	for _, i := range pods {
		podNames = append(podNames, strconv.Itoa(i))
	}
	return forEach(ctx, podNames, 32, func(ctx context.Context, s string) error {
		i, _ := strconv.Atoi(s)
		return cl.Create(ctx, barePod(scaleNS, "filler-"+s, names[i%len(names)]))
	})
}

// createScalePods creates the Deployments (100 replicas each, under
// maxUnavailable 10% PDBs) and the numbered bare pods, and waits until
// those and the bare pods made before (bare in all) run. It returns how many
// never got there (stragglers: kwok at fleet load leaves a few behind).
func createScalePods(ctx context.Context, cl client.Client, names []string, deployments int, pods []int, bare int) (int, error) {
	for i := range deployments {
		app := fmt.Sprintf("web-%d", i)
		if err := create(ctx, cl, builder.Deployment(scaleNS, app, scaleReplicas)); err != nil {
			return 0, err
		}
		if err := create(ctx, cl, builder.PDB(scaleNS, app, builder.MaxUnavailable("10%"))); err != nil {
			return 0, err
		}
	}
	if err := createBarePods(ctx, cl, names, pods); err != nil {
		return 0, err
	}
	return waitRunning(ctx, cl, scaleNS, deployments*100, bare)
}

// Stragglers: once at most maxStragglers pods are not Running and that number
// has not dropped for stragglerStall, the run goes on and reports them.
const stragglerStall = time.Minute

func maxStragglers(pods int) int { return max(pods/1000, 5) }

// waitRunning waits until want pods of the namespace exist and run (phase
// Running: a pod's Ready condition is the kubelet's, and kwok leaves a few
// stale at fleet load), tolerating a few stragglers. It counts the pods not
// running with a field selector and the Deployments' pods from their status,
// so the poll stays small at 40,000 pods.
func waitRunning(ctx context.Context, cl client.Client, ns string, deploymentPods, bare int) (int, error) {
	want := deploymentPods + bare
	best, lastDrop := want, time.Now()
	err := harness.PollEvery(ctx, 2*time.Second, 25*time.Minute, func(ctx context.Context) (bool, error) {
		var ds appsv1.DeploymentList
		if err := cl.List(ctx, &ds, client.InNamespace(ns)); err != nil {
			return false, err
		}
		exist := bare
		for _, d := range ds.Items {
			exist += int(d.Status.Replicas)
		}
		var notRunning metav1.PartialObjectMetadataList
		notRunning.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := cl.List(ctx, &notRunning, client.InNamespace(ns), client.MatchingFieldsSelector{
			Selector: fields.OneTermNotEqualSelector("status.phase", string(corev1.PodRunning))}); err != nil {
			return false, err
		}
		missing := max(want-exist, 0) + len(notRunning.Items)
		if missing < best {
			best, lastDrop = missing, time.Now()
		}
		return missing == 0 || (missing <= maxStragglers(want) && time.Since(lastDrop) >= stragglerStall), nil
	})
	if err != nil {
		return best, fmt.Errorf("%d of %d pods not running: %w", best, want, err)
	}
	if best > 0 {
		logf("scale: going on with %d of %d pods not running after %s without progress", best, want, stragglerStall)
	}
	return best, nil
}

// fleetDeletion is one drainer's deletion of a set of nodes.
type fleetDeletion struct {
	Nodes int `json:"nodes"`
	// Pods were on the nodes when the deletion started.
	setPods
	// Released is when the last node was gone; Median the median node's.
	Released time.Duration `json:"released"`
	Median   time.Duration `json:"medianReleased"`
	// Gone is when each node went, in order.
	Gone []time.Duration `json:"gone,omitempty"`
	// Phases are each node's steps, in the order the nodes went.
	Phases []nodePhases `json:"phases,omitempty"`
	// StatusElsewhere counts status writes of nodes outside the set.
	StatusElsewhere int `json:"statusWritesElsewhere,omitempty"`
	// Evictions split the nodes' eviction time.
	Evictions evictionTimes `json:"evictionTimes"`
	// Retries are the deletes the deleter had to send again.
	Retries deleteRetries `json:"retriedDeletes"`
	// Restarts are the drainer's restarts after its drain stalled.
	Restarts int `json:"restarts,omitempty"`
	// EventsDropped are the events nodeguard recorded but did not write
	// (nodeguard_events_dropped_total over the window).
	EventsDropped int `json:"eventsDropped,omitempty"`
	// API is every request the drainer sent in the window (nodeguard's
	// watches, lists, lease renewals and status writes included; kubectl's
	// discovery included).
	API requestCount `json:"api"`
	// Handoff and Wakeup are nodeguard's own histograms over the window:
	// nodeguard_drain_slot_handoff_seconds, nodeguard_drain_wakeup_delay_seconds.
	Handoff histogram `json:"slotHandoff,omitzero"`
	Wakeup  histogram `json:"wakeupDelay,omitzero"`
	// Budgets is what the Deployments' PDBs saw in the window.
	Budgets budgetWatch `json:"budgets"`
}

// scaleReplicas and scaleBudget are each Deployment's replicas and what its
// PDB (maxUnavailable 10%) lets be unavailable.
const (
	scaleReplicas = 100
	scaleBudget   = scaleReplicas / 10
)

// budgetWatch is, over a drainer's window, the most pods of one Deployment
// unavailable at once (not Ready, deleting, or missing: the PDB's reading)
// and how many times a Deployment went over its PDB's budget.
type budgetWatch struct {
	MostUnavailable int `json:"mostUnavailable"`
	Exceeded        int `json:"exceeded"`
}

// budgetTracker watches the Deployments' pods for budgetWatch.
type budgetTracker struct {
	tr                *podTracker
	workloads         []string
	replicas, allowed int // each Deployment's, and what its PDB lets be unavailable
}

func startBudgetWatch(ctx context.Context, env *harness.Env, deployments int) (*budgetTracker, error) {
	var workloads []string
	for i := range deployments {
		workloads = append(workloads, fmt.Sprintf("%s/web-%d", scaleNS, i))
	}
	return watchBudgets(ctx, env, workloads, scaleReplicas, scaleBudget)
}

// watchBudgets watches the pods of the workloads ("ns/app"), each of
// replicas under a PDB that allows allowed unavailable.
func watchBudgets(ctx context.Context, env *harness.Env, workloads []string, replicas, allowed int) (*budgetTracker, error) {
	b := &budgetTracker{workloads: workloads, replicas: replicas, allowed: allowed}
	want := map[string]int{}
	for _, w := range workloads {
		want[w] = replicas
	}
	var err error
	b.tr, err = startPodTracker(ctx, env.Config, "app!="+barePodApp, want)
	return b, err
}

func (b *budgetTracker) begin() { b.tr.begin() }

func (b *budgetTracker) result() budgetWatch {
	var w budgetWatch
	for _, name := range b.workloads {
		w.MostUnavailable = max(w.MostUnavailable, b.tr.maxUnavailable(name))
		w.Exceeded += dropsBelow(b.tr.healthyTimeline(name), b.replicas-b.allowed)
	}
	return w
}

// The histograms of nodeguard's the fleet deletion reports.
const (
	handoffMetric       = "nodeguard_drain_slot_handoff_seconds"
	wakeupMetric        = "nodeguard_drain_wakeup_delay_seconds"
	droppedEventsMetric = "nodeguard_events_dropped_total"
)

// nodeWrites are a deletion's writes per deleted node.
type nodeWrites struct{ node, status, events float64 }

func (w nodeWrites) total() float64 { return w.node + w.status + w.events }

// writesPerNode counts the drainer's writes of nodes, node status and
// events per deleted node, from its requests.
func (f *fleetDeletion) writesPerNode() nodeWrites {
	n := float64(max(f.Nodes, 1))
	sum := func(kinds ...string) float64 {
		total := 0
		for _, k := range kinds {
			total += f.API.Requests[k]
		}
		return float64(total) / n
	}
	return nodeWrites{
		node:   sum("PATCH nodes", "UPDATE nodes"),
		status: sum("PATCH nodes/status", "UPDATE nodes/status"),
		events: sum("CREATE events", "PATCH events", "UPDATE events"),
	}
}

// readSteps reads each node's steps and the evictions' times from the
// deletion's marks, given when each node went.
func (f *fleetDeletion) readSteps(start time.Time, marks []requestMark, gone map[string]time.Duration) {
	f.Phases = phasesOf(start, marks, f.podNode, gone)
	f.StatusElsewhere = statusWritesElsewhere(marks, gone)
	f.Evictions = evictionTimesOf(start, marks, f.podNode, f.pdbOf, f.Phases)
}

func (f *fleetDeletion) perPod() float64 { return float64(f.API.total()) / float64(max(f.Total, 1)) }

// deleteWithNodeguard deletes the nodes at once, one request each (as an
// autoscaler does), through nodeguard's request counter (the deletes count as
// nodeguard's), retrying the ones the webhook denies, and waits until every
// node is gone.
func deleteWithNodeguard(ctx context.Context, cl client.Client, api *requestCounter, metricsURL string, nodes []string) (*fleetDeletion, error) {
	pods, err := podsOn(ctx, cl, nodes)
	if err != nil {
		return nil, err
	}
	f := &fleetDeletion{Nodes: len(nodes), setPods: pods}
	deleter, err := counterClient(api)
	if err != nil {
		return nil, err
	}
	metricsBefore, err := scrapeHistograms(ctx, metricsURL, handoffMetric, wakeupMetric)
	if err != nil {
		return nil, err
	}
	droppedBefore, err := scrapeCounter(ctx, metricsURL, droppedEventsMetric)
	if err != nil {
		return nil, err
	}
	before, marks := api.snapshot(), api.track()
	start := time.Now()
	if f.Retries, err = deleteRetrying(ctx, deleter, nodes); err != nil {
		return nil, err
	}
	gone, goneAt, err := waitGone(ctx, cl, "nodeguard", start, nodes)
	f.API = api.snapshot().since(before)
	f.readSteps(start, marks(), goneAt)
	if after, serr := scrapeHistograms(ctx, metricsURL, handoffMetric, wakeupMetric); serr == nil {
		f.Handoff = after[handoffMetric].since(metricsBefore[handoffMetric])
		f.Wakeup = after[wakeupMetric].since(metricsBefore[wakeupMetric])
	} else {
		logf("scale: reading nodeguard's metrics: %v", serr)
	}
	if dropped, derr := scrapeCounter(ctx, metricsURL, droppedEventsMetric); derr == nil {
		f.EventsDropped = int(dropped - droppedBefore)
	} else {
		logf("scale: reading nodeguard's metrics: %v", derr)
	}
	f.Released, f.Median, f.Gone = gone[len(gone)-1], gone[len(gone)/2], gone
	return f, err
}

// drainWithKubectl runs `kubectl drain` then `kubectl delete node` for every
// node, parallel at a time, and waits until every node is gone. A node went
// when its kubectl delete returned (it waits for the node to go): the poll
// starts only once the loop is done.
func drainWithKubectl(ctx context.Context, cl client.Client, api *requestCounter, nodes []string, parallel int) (*fleetDeletion, error) {
	pods, err := podsOn(ctx, cl, nodes)
	if err != nil {
		return nil, err
	}
	f := &fleetDeletion{Nodes: len(nodes), setPods: pods}
	var mu sync.Mutex
	var deleted []time.Duration
	deletedAt := map[string]time.Duration{}
	before, marks := api.snapshot(), api.track()
	start := time.Now()
	if err := forEach(ctx, nodes, parallel, func(ctx context.Context, n string) error {
		for _, args := range [][]string{
			{"drain", n, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=10m"},
			{"delete", "node", n},
		} {
			if out, err := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", api.Kubeconfig}, args...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, lastLine(string(out)))
			}
		}
		mu.Lock()
		defer mu.Unlock()
		deleted = append(deleted, time.Since(start))
		deletedAt[n] = deleted[len(deleted)-1]
		return nil
	}); err != nil {
		return nil, err
	}
	gone, _, err := waitGone(ctx, cl, "kubectl", start, nodes)
	f.API = api.snapshot().since(before)
	f.readSteps(start, marks(), deletedAt)
	slices.Sort(deleted)
	f.Released, f.Median, f.Gone = gone[len(gone)-1], deleted[len(deleted)/2], deleted
	return f, err
}

// waitGone waits until the nodes of a set are gone and returns when each
// went, in order and by name (by this poll's 250 ms).
func waitGone(ctx context.Context, cl client.Client, set string, start time.Time, names []string) ([]time.Duration, map[string]time.Duration, error) {
	var gone []time.Duration
	goneAt := map[string]time.Duration{}
	err := harness.PollEvery(ctx, 250*time.Millisecond, 20*time.Minute, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes, client.MatchingLabels{scaleSetLabel: set}); err != nil {
			return false, err
		}
		left := map[string]bool{}
		for _, n := range nodes.Items {
			left[n.Name] = true
		}
		for _, name := range names {
			if _, seen := goneAt[name]; !seen && !left[name] {
				goneAt[name] = time.Since(start)
				gone = append(gone, goneAt[name])
			}
		}
		return len(nodes.Items) == 0, nil
	})
	for len(gone) < len(names) {
		gone = append(gone, time.Since(start))
	}
	return gone, goneAt, err
}

// setPods is what a set of nodes held when its deletion started.
type setPods struct {
	// Total pods, of them UnderPDBs the Deployments' (the rest are bare);
	// MostOfOne is the most pods of one Deployment: past its PDB's budget,
	// its evictions wait for replacements.
	Total     int `json:"pods"`
	UnderPDBs int `json:"podsUnderPDBs"`
	MostOfOne int `json:"mostPodsOfOneDeployment"`
	// PerApp counts the pods of each Deployment.
	PerApp map[string]int `json:"perDeployment,omitempty"`
	// podNode is the node of each pod (namespace/name); pdbOf the
	// Deployment (and so the PDB) of each pod of one.
	podNode map[string]string
	pdbOf   map[string]string
}

// podMetaOn lists the metadata of the pods on the node.
func podMetaOn(ctx context.Context, cl client.Client, node string) ([]metav1.PartialObjectMetadata, error) {
	var pods metav1.PartialObjectMetadataList
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	err := cl.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node})
	return pods.Items, err
}

// podsOn counts the pods on the nodes.
func podsOn(ctx context.Context, cl client.Client, nodes []string) (setPods, error) {
	var mu sync.Mutex
	sp := setPods{PerApp: map[string]int{}, podNode: map[string]string{}, pdbOf: map[string]string{}}
	perApp := sp.PerApp
	err := forEach(ctx, nodes, 8, func(ctx context.Context, n string) error {
		pods, err := podMetaOn(ctx, cl, n)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		sp.Total += len(pods)
		for _, p := range pods {
			sp.podNode[p.Namespace+"/"+p.Name] = n
			if app := p.Labels["app"]; app != barePodApp {
				sp.pdbOf[p.Namespace+"/"+p.Name] = app
				sp.UnderPDBs++
				perApp[app]++
				sp.MostOfOne = max(sp.MostOfOne, perApp[app])
			}
		}
		return nil
	})
	return sp, err
}

func nodeIP(i int) string { return fmt.Sprintf("10.40.%d.%d", i/250, i%250+1) }

// barePodApp labels the bare pods (app=filler).
const barePodApp = "filler"

// barePod is a pod bound to a node, owned by no controller.
func barePod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": barePodApp}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Containers:                    []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

func scaleTable(r *scaleResult) *bench.Table {
	if r == nil || len(r.Phases) == 0 {
		return nil
	}
	t := &bench.Table{
		Title: fmt.Sprintf("4. Scale: %d kwok nodes, %d pods; nodeguard beside the stock controllers", r.Nodes, r.Pods),
		Header: []string{"phase", "duration", "nodeguard RSS", "nodeguard CPU", "kube-controller-manager RSS", "kube-controller-manager CPU",
			"kube-scheduler RSS", "kube-scheduler CPU", "nodeguard / KCM RSS"},
	}
	for _, p := range r.Phases {
		row := []string{p.Name, bench.Seconds(p.Duration)}
		for _, n := range scaleProcs {
			row = append(row, mib(p.RSS[n]), fmt.Sprintf("%.2f cores", p.CPU[n]))
		}
		row = append(row, bench.Times(float64(p.RSS["nodeguard"])/float64(max(p.RSS["kube-controller-manager"], 1))))
		t.AddRow(row...)
	}
	t.Note("How to read it: the target is nodeguard's peak RSS under 150 MiB and under half of kube-controller-manager's (last column ≤ 0.50×) once the cluster holds its pods; the empty cluster shows each process's base footprint. RSS is the peak of 1-second samples of /proc/<pid>/status in the phase; CPU is user+system time over the phase ÷ its wall time. kube-controller-manager and kube-scheduler cache every pod; nodeguard keeps each pod's node only (its eviction webhook's map) and lists a draining node's pods on demand.")
	if slope, ok := r.rssPerThousandNodes(); ok {
		last := r.Idle[len(r.Idle)-1]
		const target = rssTargetNodes
		at, _ := r.extrapolatedRSS(target)
		t.Note("nodeguard's idle RSS grows %s per 1,000 nodes (with %d pods each): %s at %d nodes and %d pods, %s at %d and %d (each the median of an idle window's 1-second samples: %s and %s); extrapolated to %d nodes and %d pods: **%s** (≤ 150 MiB wanted), before a deletion's peak.",
			mib(int64(slope)), last.Pods/max(last.Nodes, 1), mib(r.Idle[0].RSS), r.Idle[0].Nodes, r.Idle[0].Pods, mib(last.RSS), last.Nodes, last.Pods,
			r.Idle[0].spread(), last.spread(), target, target*last.Pods/max(last.Nodes, 1), mib(at))
	}
	t.Note("%d of the pods belong to %d Deployments under maxUnavailable 10%% PDBs; the rest are created bound to their nodes (no controller). The run goes on once every pod is Running (phase, not the Ready condition, which kwok leaves stale on a few pods at fleet load), or once at most %d are not and that number has not dropped for %s: %d pods were not running.",
		r.DeploymentPods, r.DeploymentPods/100, maxStragglers(r.Pods), stragglerStall, r.Stragglers)
	return t
}

// fleetTable compares the fleet deletion: nodeguard against the kubectl loop.
func fleetTable(r *scaleResult) *bench.Table {
	if r == nil || r.Nodeguard == nil {
		return nil
	}
	t := &bench.Table{
		Title: fmt.Sprintf("4b. Fleet deletion: %d of %d nodes at once under an NDB of maxUnavailable %s, pods under PDBs", r.Deleted, r.Nodes, scaleNDB),
		Header: []string{"drainer", "nodes", "pods on them (under PDBs; most of one Deployment)", "every node released", "median node released", "eviction requests", "refused (429)",
			fmt.Sprintf("most pods of a Deployment unavailable (PDB allows %d)", scaleBudget), "PDB exceeded", "API requests", "API requests / drained pod"},
	}
	row := func(name string, f *fleetDeletion) {
		if f == nil {
			return
		}
		t.AddRow(name, fmt.Sprint(f.Nodes), fmt.Sprintf("%d (%d; %d)", f.Total, f.UnderPDBs, f.MostOfOne), bench.Seconds(f.Released), bench.Seconds(f.Median),
			fmt.Sprint(f.API.evictionRequests()), fmt.Sprint(f.API.Evictions[429]), fmt.Sprint(f.Budgets.MostUnavailable),
			fmt.Sprintf("%d times", f.Budgets.Exceeded), fmt.Sprint(f.API.total()), fmt.Sprintf("%.1f", f.perPod()))
	}
	row(fmt.Sprintf("nodeguard (%d node deletes at once, --max-concurrent-drains=%d)", r.Deleted, finalizer.DefaultMaxConcurrentNodes), r.Nodeguard)
	row(fmt.Sprintf("`kubectl drain --force` + `kubectl delete node`, %d at a time", r.Parallel), r.Kubectl)
	t.Note("How to read it: lower is better in every column; the two rows drain sets of the same size and layout in the same cluster, one after the other (the kubectl set is cordoned while nodeguard works, so neither set receives the other's evicted pods). The two sets are dealt from the first %d nodes once the pods are placed, so that each holds as many Deployment pods, Deployment by Deployment (the pods column): those are the ones the PDBs gate (a Deployment's pods past its budget wait for replacements), and the scheduler does not spread them evenly (dealt by name, one set held 553 against 401). nodeguard drains %d nodes at a time by default, and the kubectl loop runs at the same parallelism.", 2*r.Deleted, r.Parallel)
	t.Note("Times run from the first delete (nodeguard) or the first kubectl drain until the node object is gone, by a 250 ms poll. API requests are every request each drainer sent through its own counting proxy in that window: for nodeguard its watches, lists, evictions, status writes and Lease renewals, and the node deletes (one request per node, a denied or unanswered one retried every %s: %d denied with 429, %d not answered by the webhook within kube-apiserver's 5 s webhook timeout); for kubectl every drain and delete process, discovery included. Refused (429) are evictions a PDB did not allow yet.", rollingRetry, r.Nodeguard.Retries.Denied, r.Nodeguard.Retries.WebhookFailed)
	t.Note("A Deployment's pods are unavailable when not Ready, deleting or not yet replaced, as its PDB (maxUnavailable 10%%: %d of %d) reads them, from a watch of the pods over each drainer's window; \"PDB exceeded\" counts the times a Deployment had fewer than %d healthy pods. The NDB (maxUnavailable %s of the %d nodes) allows more than the %d nodes deleted: it cannot be exceeded here; section 6 measures a node budget that binds.",
		scaleBudget, scaleReplicas, scaleReplicas-scaleBudget, scaleNDB, r.Nodes, r.Deleted)
	t.Note("nodeguard's own view (its metrics over the deletion, bucket bounds): drain slot handoff, from a node's last pod gone to the first eviction of the node that takes its slot (%s): %s; PDB wake-up, from a status that allows a disruption again to the eviction sent for it (%s): %s.",
		handoffMetric, r.Nodeguard.Handoff.summary(), wakeupMetric, r.Nodeguard.Wakeup.summary())
	if w := r.Nodeguard.writesPerNode(); r.Nodeguard.Nodes > 0 {
		t.Note("nodeguard's writes per deleted node (evictions, Leases and the deletes apart): %.1f of nodes, %.1f of node status and %.1f of events, **%.1f in all** (≤ 6 wanted); events recorded but not written (%s): %d. The status and event writes per deleted node by what they say (a status write by the phase its Terminating condition names): %s; of the status writes, %d were of nodes outside the set (drains nodeguard follows).",
			w.node, w.status, w.events, w.total(), droppedEventsMetric, r.Nodeguard.EventsDropped, r.Nodeguard.API.writesByReason(r.Nodeguard.Nodes), r.Nodeguard.StatusElsewhere)
	}
	if note := boundNote(r); note != "" {
		t.Note("%s", note)
	}
	for _, d := range []struct {
		name string
		f    *fleetDeletion
	}{{"nodeguard", r.Nodeguard}, {"the kubectl loop", r.Kubectl}} {
		if d.f != nil && len(d.f.Phases) > 0 {
			how := phasesSummary(d.f.Phases, 10, 5)
			if e := d.f.Evictions; len(e.BareRoundTrips)+len(e.PDBRoundTrips) > 0 {
				how += "; " + e.summary()
			}
			t.Note("Where %s's time went, node by node, from its requests (its first write of the node: the cordon; its first eviction sent; its last eviction granted; the node gone%s): %s.",
				d.name, goneHow(d.f == r.Kubectl), how)
		}
	}
	if r.Nodeguard != nil && r.Kubectl != nil {
		t.Note("nodeguard's requests by kind: %s. kubectl's: %s.", topRequests(r.Nodeguard.API, 8), topRequests(r.Kubectl.API, 8))
	}
	return t
}

// goneHow says what "gone" means in a drainer's phases.
func goneHow(kubectl bool) string {
	if kubectl {
		return ", when its kubectl delete returned"
	}
	return ", by the 250 ms poll"
}

// topRequests lists the n most frequent kinds of request.
func topRequests(c requestCount, n int) string {
	var out []string
	for i, e := range mostFirst(c.Requests) {
		if i == n {
			out = append(out, "…")
			break
		}
		out = append(out, fmt.Sprintf("%s %d", e.key, e.n))
	}
	return strings.Join(out, ", ")
}
