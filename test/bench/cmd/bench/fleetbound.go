package main

import (
	"context"
	"fmt"
	"iter"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/finalizer"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The fleet's lower bound, as the drain section's but for many nodes: the
// largest of
//   - the chain term: for each Deployment, its pods in the set ÷ what its PDB
//     allows at a time is its rounds of evictions; the rounds after the first
//     each wait for a replacement cycle (the last round's pods go without
//     waiting for their replacements), measured idle at fleet load;
//   - the throughput term: the replacements that gate the last evictions
//     (per Deployment its pods in the set − what its PDB allows) × the
//     ReplicaSet controller's writes per replaced pod, less its client's
//     burst, ÷ its client's QPS;
//   - the eviction term: the set's pods ÷ the most evictions a second the
//     cluster granted in bursts of the cheapest evictions it has (bare pods
//     on nodes of neither set, zero grace: no PDB to read or write, no
//     replacement, gone when answered), sent through a counting proxy as
//     the drainers' are, more at a time than either drainer keeps in flight.
//     The bound has the first two; this one says how fast the
//     cluster can evict at all, which at 2,000 nodes on 2 cores is what
//     binds (the drainers stay well above it: RESULTS.md).
//
// The drain section reads the ReplicaSet controller's writes from the audit
// log; at 40,000 pods the audit log of the namespace would be the bench's
// own pod creations, so here a watch counts them: the replacement pods it
// creates, its ReplicaSet status writes (a ReplicaSet changed at the same
// generation) and its events.

// fleetBound is the fleet deletion's lower bound and what it is made of.
type fleetBound struct {
	// Cycles are the idle replacement cycles: a Deployment's pod evicted,
	// until its PDB allows its whole budget again.
	Cycles []time.Duration `json:"replacementCycles"`
	// Longest is the Deployment with the most rounds in nodeguard's set.
	Longest       string `json:"longestChain"`
	LongestPods   int    `json:"longestChainPods"`
	LongestRounds int    `json:"longestChainRounds"`
	// Gating are the replacements that gate the last evictions.
	Gating int `json:"gatingReplacements"`
	// WritesPerPod is the ReplicaSet controller's writes per replaced pod,
	// the fewer of the two drainers' windows (as in the drain section).
	WritesPerPod map[string]float64 `json:"writesPerReplacedPod"`
	// EvictionRates are the evictions a second of each probe burst; Pods
	// are the pods of nodeguard's set.
	EvictionRates []float64     `json:"evictionRates,omitempty"`
	Pods          int           `json:"setPods,omitempty"`
	Chain         time.Duration `json:"chainTerm"`
	Throughput    time.Duration `json:"throughputTerm"`
	Eviction      time.Duration `json:"evictionTerm,omitempty"`
}

func (b *fleetBound) value() time.Duration { return max(b.Chain, b.Throughput, b.Eviction) }

// twoTerms is the bound as issue #43 defines it, without the eviction term.
func (b *fleetBound) twoTerms() time.Duration { return max(b.Chain, b.Throughput) }

func (b *fleetBound) binds() string {
	switch b.value() {
	case b.Chain:
		return "chain"
	case b.Throughput:
		return "throughput"
	}
	return "eviction"
}

// fewestWrites is the fewer of the drainers' writes per replaced pod.
func (b *fleetBound) fewestWrites() float64 {
	fewest := 0.0
	for _, w := range b.WritesPerPod {
		if fewest == 0 || (w > 0 && w < fewest) {
			fewest = w
		}
	}
	return fewest
}

// compute fills in the terms from the cycles, the writes, the eviction
// rates and the pods of nodeguard's set, per Deployment and in all.
func (b *fleetBound) compute(perApp map[string]int, pods int) {
	b.Gating, b.LongestRounds = 0, 0
	for _, app := range slices.Sorted(mapKeys(perApp)) {
		n := perApp[app]
		b.Gating += max(n-scaleBudget, 0)
		if rounds := (n + scaleBudget - 1) / scaleBudget; rounds > b.LongestRounds {
			b.Longest, b.LongestPods, b.LongestRounds = app, n, rounds
		}
	}
	b.Chain = bench.ChainTerm([]int{b.LongestRounds}, bench.Mean(b.Cycles))
	b.Throughput = bench.ThroughputTerm(b.fewestWrites(), b.Gating, kcmClientQPS, kcmClientBurst)
	b.Pods, b.Eviction = pods, 0
	if len(b.EvictionRates) > 0 {
		b.Eviction = time.Duration(float64(pods) / slices.Max(b.EvictionRates) * float64(time.Second))
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fleetCycles measures n replacement cycles at fleet load with nothing else
// running: one at a time, a pod of a Deployment on a node of neither set is
// evicted, and the cycle runs from the eviction request until the PDB allows
// as many disruptions again as just before it (the replacement created,
// scheduled, started and Ready, the disruption controller's status write).
// Not its whole budget: at fleet load kwok leaves the Ready condition of a
// few pods stale, and their PDBs never allow their whole budget.
func fleetCycles(ctx context.Context, cl client.Client, cs kubernetes.Interface, n, deployments int, sets []string) ([]time.Duration, error) {
	var cycles []time.Duration
	for i := range n {
		app := fmt.Sprintf("web-%d", i%deployments)
		allowed, err := pdbAllows(ctx, cl, app)
		if err != nil {
			return cycles, err
		}
		if allowed == 0 {
			continue // a PDB that allows nothing times no cycle
		}
		pod, err := readyPodOutside(ctx, cl, app, sets)
		if err != nil {
			return cycles, err
		}
		sent := time.Now()
		if err := evictByName(ctx, cs, scaleNS, pod); err != nil {
			return cycles, err
		}
		err = harness.PollEvery(ctx, 20*time.Millisecond, 5*time.Minute, func(ctx context.Context) (bool, error) {
			now, err := pdbAllows(ctx, cl, app)
			return now >= allowed, err
		})
		if err != nil {
			return cycles, fmt.Errorf("waiting for PDB %s to allow %d disruptions again: %w", app, allowed, err)
		}
		cycles = append(cycles, time.Since(sent))
	}
	return cycles, nil
}

// evictionProbe is the eviction term's measurement: rounds bursts of pods
// evictions each, workers at a time. Either drainer keeps fewer in flight:
// the kubectl loop's ten drains send a node's 20-odd pods at once, nodeguard's
// ten slots a node's unprotected pods at once.
type evictionProbe struct{ rounds, pods, workers int }

// fleetProbe sends 25 evictions at a time per drain slot (a node's pods and
// some), two each, in two bursts: the faster counts.
func fleetProbe(c config) evictionProbe {
	workers := 25 * min(finalizer.DefaultMaxConcurrentNodes, c.scaleDelete)
	return evictionProbe{rounds: 2, pods: 2 * workers, workers: workers}
}

// evictionRates sends each round's burst through a counting proxy of its
// own (as the drainers' requests go) and returns its evictions a second,
// from the first request until the last answer. The pods are bare pods of
// the nodes outside, from the last: a bare pod has a zero grace period, so
// a granted eviction deletes it at once.
func evictionRates(ctx context.Context, env *harness.Env, cl client.Client, outside []string, p evictionProbe) ([]float64, error) {
	api, err := startRequestCounter(env.Config, filepath.Join(env.Dir, "scale-probe.kubeconfig"))
	if err != nil {
		return nil, err
	}
	defer api.close()
	cfg, err := counterConfig(api)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pods, err := barePodsOf(ctx, cl, slices.Backward(outside), p.rounds*p.pods)
	if err != nil {
		return nil, err
	}
	if len(pods) < p.rounds*p.pods {
		// A small run (--scale-pods) may have few bare pods outside the sets.
		logf("scale: only %d bare pods outside the deleted sets, %d wanted: no eviction term", len(pods), p.rounds*p.pods)
		return nil, nil
	}
	var rates []float64
	for burst := range slices.Chunk(pods, p.pods) {
		start := time.Now()
		if err := forEach(ctx, burst, p.workers, func(ctx context.Context, pod string) error {
			return evictByName(ctx, cs, scaleNS, pod)
		}); err != nil {
			return rates, err
		}
		rates = append(rates, float64(len(burst))/time.Since(start).Seconds())
	}
	return rates, nil
}

// evictByName asks the Eviction API to evict the pod.
func evictByName(ctx context.Context, cs kubernetes.Interface, ns, pod string) error {
	if err := cs.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}); err != nil {
		return fmt.Errorf("evicting %s: %w", pod, err)
	}
	return nil
}

// barePodsOf names up to n bare pods on the nodes, in the nodes' order.
func barePodsOf(ctx context.Context, cl client.Client, nodes iter.Seq2[int, string], n int) ([]string, error) {
	var names []string
	for _, node := range nodes {
		if len(names) == n {
			break
		}
		pods, err := podMetaOn(ctx, cl, node)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			if p.Labels["app"] == barePodApp && p.DeletionTimestamp == nil && len(names) < n {
				names = append(names, p.Name)
			}
		}
	}
	return names, nil
}

// pdbAllows reads how many disruptions the Deployment's PDB allows, once
// its status is of its current generation.
func pdbAllows(ctx context.Context, cl client.Client, app string) (int32, error) {
	var pdb policyv1.PodDisruptionBudget
	if err := cl.Get(ctx, client.ObjectKey{Namespace: scaleNS, Name: app}, &pdb); err != nil {
		return 0, err
	}
	if pdb.Status.ObservedGeneration != pdb.Generation {
		return 0, nil
	}
	return pdb.Status.DisruptionsAllowed, nil
}

// readyPodOutside names a Ready pod of the Deployment on a node of neither set.
func readyPodOutside(ctx context.Context, cl client.Client, app string, sets []string) (string, error) {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(scaleNS), client.MatchingLabels{"app": app}); err != nil {
		return "", err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && podReady(p) && !slices.Contains(sets, p.Spec.NodeName) {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("no Ready pod of %s outside the deleted sets", app)
}

// rsWrites counts the ReplicaSet controller's writes in the scale
// namespace while counting: pods it creates, ReplicaSet status writes and
// its events (created or counted again).
type rsWrites struct {
	mu       sync.Mutex
	counting bool
	created  int
	status   int
	events   int
}

func startRSWrites(ctx context.Context, cs kubernetes.Interface) (*rsWrites, error) {
	w := &rsWrites{}
	inNS := informers.WithNamespace(scaleNS)
	deployPods := informers.NewSharedInformerFactoryWithOptions(cs, 0, inNS,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app!=" + barePodApp }))
	if err := watchSynced(ctx, deployPods, deployPods.Core().V1().Pods().Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok && ownedByReplicaSet(p) {
				w.count(&w.created)
			}
		},
	}); err != nil {
		return nil, err
	}
	rs := informers.NewSharedInformerFactoryWithOptions(cs, 0, inNS)
	if err := watchSynced(ctx, rs, rs.Apps().V1().ReplicaSets().Informer(), cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*appsv1.ReplicaSet)
			n, ok2 := newObj.(*appsv1.ReplicaSet)
			if ok1 && ok2 && o.ResourceVersion != n.ResourceVersion && o.Generation == n.Generation {
				w.count(&w.status)
			}
		},
	}); err != nil {
		return nil, err
	}
	events := informers.NewSharedInformerFactoryWithOptions(cs, 0, inNS,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("source", "replicaset-controller").String()
		}))
	if err := watchSynced(ctx, events, events.Core().V1().Events().Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.count(&w.events) },
		UpdateFunc: func(any, any) { w.count(&w.events) },
	}); err != nil {
		return nil, err
	}
	return w, nil
}

func ownedByReplicaSet(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "ReplicaSet" })
}

func (w *rsWrites) count(n *int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counting {
		*n++
	}
}

// begin starts a window from zero.
func (w *rsWrites) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counting, w.created, w.status, w.events = true, 0, 0, 0
}

// end stops the window and returns the writes per replaced pod.
func (w *rsWrites) end() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counting = false
	if w.created == 0 {
		return 0
	}
	return float64(w.created+w.status+w.events) / float64(w.created)
}

// waitDeploymentsWhole waits until every Deployment of the namespace has all
// its replicas available: a drainer's replacements are done.
func waitDeploymentsWhole(ctx context.Context, cl client.Client, ns string) error {
	return waitDeploymentsBack(ctx, cl, ns, nil)
}

// availableReplicas are the Deployments' available replicas now.
func availableReplicas(ctx context.Context, cl client.Client, ns string) (map[string]int32, error) {
	var ds appsv1.DeploymentList
	if err := cl.List(ctx, &ds, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, d := range ds.Items {
		out[d.Name] = d.Status.AvailableReplicas
	}
	return out, nil
}

// waitDeploymentsBack waits until every Deployment of the namespace has as
// many replicas available as before (all of them, for nil): at fleet load
// kwok leaves the Ready condition of a few pods stale, and those never count.
func waitDeploymentsBack(ctx context.Context, cl client.Client, ns string, before map[string]int32) error {
	return harness.PollEvery(ctx, time.Second, 10*time.Minute, func(ctx context.Context) (bool, error) {
		var ds appsv1.DeploymentList
		if err := cl.List(ctx, &ds, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, d := range ds.Items {
			want := *d.Spec.Replicas
			if before != nil {
				want = min(want, before[d.Name])
			}
			if d.Status.ObservedGeneration < d.Generation || d.Status.AvailableReplicas < want || d.Status.Replicas != *d.Spec.Replicas {
				return false, nil
			}
		}
		return true, nil
	})
}

// boundNote says what the fleet's bound is and how each drainer compares.
func boundNote(r *scaleResult) string {
	b := r.Bound
	if b == nil || len(b.Cycles) == 0 {
		return ""
	}
	var writes []string
	for _, d := range slices.Sorted(mapKeys(b.WritesPerPod)) {
		writes = append(writes, fmt.Sprintf("%.2f in %s's window", b.WritesPerPod[d], d))
	}
	s := fmt.Sprintf("The fleet's lower bound: max(chain term %s: %s, %d of its pods in nodeguard's set ÷ %d at a time = %d rounds, %d cycles × the idle replacement cycle %s (mean of %d, %s–%s, at fleet load); throughput term %s: the ReplicaSet controller wrote %s per replaced pod (pods, status writes and events, from the drain's start until every Deployment was whole again; the fewer counts) × %d gating replacements − %d ÷ %d/s",
		bench.Seconds(b.Chain), b.Longest, b.LongestPods, scaleBudget, b.LongestRounds, max(b.LongestRounds-1, 0), bench.Seconds(bench.Mean(b.Cycles)), len(b.Cycles),
		bench.Seconds(slices.Min(b.Cycles)), bench.Seconds(slices.Max(b.Cycles)),
		bench.Seconds(b.Throughput), strings.Join(writes, ", "), b.Gating, kcmClientBurst, kcmClientQPS)
	if len(b.EvictionRates) > 0 {
		var rates []string
		for _, rate := range b.EvictionRates {
			rates = append(rates, fmt.Sprintf("%.1f/s", rate))
		}
		s += fmt.Sprintf("; eviction term %s: the set's %d pods ÷ %.1f evictions a second, the faster of bursts of bare pods on nodes of neither set (%s; zero grace, no PDB, no replacement: the cheapest evictions the cluster has, through a counting proxy as the drainers' go, more at a time than either drainer sends)",
			bench.Seconds(b.Eviction), b.Pods, slices.Max(b.EvictionRates), strings.Join(rates, ", "))
	}
	s += fmt.Sprintf(") = **%s**, set by the %s term.", bench.Seconds(b.value()), b.binds())
	if r.Nodeguard == nil || b.value() <= 0 {
		return s
	}
	s += fmt.Sprintf(" nodeguard released its set in **%s its bound**", bench.Times(bench.Ratio(r.Nodeguard.Released, b.value())))
	if r.Kubectl != nil {
		s += fmt.Sprintf(", the kubectl loop in %s", bench.Times(bench.Ratio(r.Kubectl.Released, b.value())))
	}
	s += " (≤ 1.15× wanted for nodeguard)."
	if b.Eviction > 0 && b.twoTerms() > 0 {
		s += fmt.Sprintf(" Against the issue's bound of the first two terms alone (%s), nodeguard %s", bench.Seconds(b.twoTerms()), bench.Times(bench.Ratio(r.Nodeguard.Released, b.twoTerms())))
		if r.Kubectl != nil {
			s += fmt.Sprintf(", the loop %s", bench.Times(bench.Ratio(r.Kubectl.Released, b.twoTerms())))
		}
		s += "."
	}
	return s
}
