package main

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/plugin"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The two drainers. Each drains a node of its own, alone in the cluster, in a
// namespace of its own per repetition ("kubectl-1", "nodeguard-1", ...).
const (
	kubectlDrainer   = "kubectl"
	nodeguardDrainer = "nodeguard"
	// cycleNS holds the Deployment whose idle budget cycles give the chain term.
	cycleNS = "cycle"
	// drainLabel selects a run's pods (the value is the run's namespace), for
	// the tracker.
	drainLabel = "bench.nodeguard.io/drain"
)

// drainResult is one profile's drain comparison: the idle budget cycles, each
// drainer's runs and the lower bound.
type drainResult struct {
	Profile     string `json:"profile"`
	PodsPerNode int    `json:"podsPerNode"`
	Chain       int    `json:"longestPDBChain"`
	// Chains are the node's PDB chains, each Chain rounds long.
	Chains int `json:"pdbChains"`
	// Gating are the replacements that must be Ready before the node can be
	// empty, over the node's PDBs (bench.Gating).
	Gating     int             `json:"gatingReplacements"`
	IdleCycles []time.Duration `json:"idleCycles"`
	Cycle      time.Duration   `json:"idleCycleMean"`
	// Busiest and WritesPerPod are the controller that wrote the most per
	// replaced pod, and how much: the median of each drainer's runs
	// (drainRun.Replacement), the fewer of the two (busiestWritesPerPod).
	Busiest      string       `json:"busiestController"`
	WritesPerPod float64      `json:"writesPerReplacedPod"`
	Bound        bench.Bound  `json:"bound"`
	Kubectl      bench.Spread `json:"kubectl"`
	Nodeguard    bench.Spread `json:"nodeguard"`
	Runs         []*drainRun  `json:"runs"`
}

// drainRun is one drainer emptying one node with the cluster to itself.
type drainRun struct {
	Drainer   string `json:"drainer"`
	Namespace string `json:"namespace"`
	// Empty runs from the start (kubectl drain started; kubectl delete node
	// issued) until the last pod object on the node is gone; Done until
	// kubectl drain exited or nodeguard released the node.
	Empty          time.Duration   `json:"empty"`
	Done           time.Duration   `json:"done"`
	FirstEviction  time.Duration   `json:"firstEviction"`
	Evictions      int             `json:"evictionRequests"`
	TooMany        int             `json:"evictions429"`
	MaxUnavailable int             `json:"maxUnavailablePerPDB"`
	MaxInFlight    int             `json:"maxEvictionsInFlightPerPDB"`
	Wakeups        []time.Duration `json:"wakeupDelays"`
	OwnChain       time.Duration   `json:"longestPDBSumOfCycles"`
	// PlanEstimate is kubectl nodeguard plan's estimate of the drain, made
	// just before it with the idle cycle as --pod-cycle (nodeguard's runs).
	PlanEstimate time.Duration `json:"planEstimate,omitempty"`
	// Controllers are kube-controller-manager's writes from the first
	// eviction until the node was empty; Replacement until the controllers
	// were done (every replacement Ready, no write for controllersQuiet):
	// all they wrote to replace the run's pods.
	Controllers []controllerLoad   `json:"controllerLoad"`
	Replacement []controllerLoad   `json:"replacementWrites"`
	Evicts      []harness.Eviction `json:"evictionLog"`
	Timeline    []bench.Point      `json:"timeline"`
}

func protectedApps(c config) []string {
	var apps []string
	for i := range c.drainApps {
		apps = append(apps, fmt.Sprintf("pdb-%c", 'a'+i))
	}
	return apps
}

// drainNamespaces are the namespaces of every drain run and of the idle
// cycles, for the audit policy.
func drainNamespaces(c config) []string {
	ns := []string{cycleNS}
	for rep := 1; rep <= c.drainReps; rep++ {
		ns = append(ns, runNamespace(kubectlDrainer, rep), runNamespace(nodeguardDrainer, rep))
	}
	return ns
}

func runNamespace(drainer string, rep int) string { return fmt.Sprintf("%s-%d", drainer, rep) }

// drainOrder is who drains first in repetition rep (from 1): they take turns,
// so that neither always inherits the other's leftovers.
func drainOrder(rep int) []string {
	if rep%2 == 0 {
		return []string{nodeguardDrainer, kubectlDrainer}
	}
	return []string{kubectlDrainer, nodeguardDrainer}
}

// runDrain measures the cluster's idle budget cycle, then lets kubectl drain
// and nodeguard each drain an identical, freshly built node alone, in turns,
// c.drainReps times each.
func runDrain(ctx context.Context, c config, env *harness.Env, profile string) (*drainResult, error) {
	r := &drainResult{Profile: profile, PodsPerNode: c.drainApps*c.drainReplicas + c.drainFree,
		Chain: bench.ChainLength(c.drainReplicas, 1), Chains: c.drainApps, Gating: c.drainApps * bench.Gating(c.drainReplicas, 1)}
	tail := &auditTail{path: env.AuditLog}
	var err error
	if r.IdleCycles, err = idleCycles(ctx, c, env, tail); err != nil {
		return nil, fmt.Errorf("idle budget cycles: %w", err)
	}
	logf("drain %s: idle budget cycle %s (mean of %d)", profile, bench.Millis(bench.Mean(r.IdleCycles)), len(r.IdleCycles))
	for rep := 1; rep <= c.drainReps; rep++ {
		for i, drainer := range drainOrder(rep) {
			run, err := drainAlone(ctx, c, env, tail, profile, drainer, rep, 2*rep+i, bench.Mean(r.IdleCycles))
			if err != nil {
				return nil, fmt.Errorf("%s drain, repetition %d: %w", drainer, rep, err)
			}
			r.Runs = append(r.Runs, run)
		}
	}
	r.summarize()
	logf("drain %s: kubectl %s, nodeguard %s; bound %s (chain %s, throughput %s)", profile, r.Kubectl, r.Nodeguard,
		bench.Seconds(r.Bound.Value()), bench.Seconds(r.Bound.Chain), bench.Seconds(r.Bound.Throughput))
	return r, nil
}

// summarize fills in the medians, spreads and the bound from the runs.
func (r *drainResult) summarize() {
	empty := func(d *drainRun) time.Duration { return d.Empty }
	r.Kubectl = bench.SpreadOf(timesOf(r.runsOf(kubectlDrainer), empty))
	r.Nodeguard = bench.SpreadOf(timesOf(r.runsOf(nodeguardDrainer), empty))
	r.Cycle = bench.Mean(r.IdleCycles)
	if r.Chains == 0 && r.Chain > 1 { // a results.json from before pdbChains: every chain gates Chain-1
		r.Chains = r.Gating / (r.Chain - 1)
	}
	r.Busiest, r.WritesPerPod = busiestWritesPerPod(r.PodsPerNode, replacementsOf(r.runsOf(kubectlDrainer)), replacementsOf(r.runsOf(nodeguardDrainer)))
	r.Bound = bench.Bound{
		Chain:      bench.ChainTerm([]int{r.Chain}, r.Cycle),
		Throughput: bench.ThroughputTerm(r.WritesPerPod, r.Gating, kcmClientQPS, kcmClientBurst),
	}
}

func (r *drainResult) runsOf(drainer string) []*drainRun {
	var out []*drainRun
	for _, run := range r.Runs {
		if run.Drainer == drainer {
			out = append(out, run)
		}
	}
	return out
}

// drainLayout builds a run's node: a target holding c.drainApps Deployments
// of c.drainReplicas under maxUnavailable 1 PDBs and c.drainFree unprotected
// pods, and two spare nodes for the replacements. Only a nodeguard run's
// target is managed by nodeguard. It returns the replicas of each protected
// workload ("ns/app") and the emulator's view of the target.
func drainLayout(ctx context.Context, c config, cl client.Client, ns string, index int, managed bool) (map[string]int, armemulator.Node, error) {
	replicas := map[string]int{}
	nodeFor := func(name string, i int) (*corev1.Node, armemulator.Node) {
		ip := fmt.Sprintf("10.20.%d.%d", index, i+4)
		id := vmssID("drain", 10*index+i)
		opts := []builder.NodeOption{builder.WithLabels("group", ns), builder.WithInternalIP(ip), builder.WithProviderID(id)}
		if managed && i == 0 {
			opts = append(opts, builder.WithLabels(managedLabel, "true"))
		}
		return builder.Node(name, opts...), armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: id}
	}
	target, emuNode := nodeFor(ns+"-target", 0)
	if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, emuNode, err
	}
	if err := create(ctx, cl, target); err != nil {
		return nil, emuNode, err
	}
	for _, app := range protectedApps(c) {
		if err := create(ctx, cl, drainDeployment(ns, app, c.drainReplicas)); err != nil {
			return nil, emuNode, err
		}
		if err := create(ctx, cl, builder.PDB(ns, app, builder.MaxUnavailable("1"))); err != nil {
			return nil, emuNode, err
		}
		replicas[ns+"/"+app] = c.drainReplicas
	}
	if err := create(ctx, cl, drainDeployment(ns, "free", c.drainFree)); err != nil {
		return nil, emuNode, err
	}
	if err := waitReadyOn(ctx, cl, ns, target.Name, c.drainApps*c.drainReplicas+c.drainFree); err != nil {
		return nil, emuNode, err
	}
	// Spare nodes take the replacements; created now so that the initial pods
	// all landed on the target.
	for i := 1; i <= 2; i++ {
		spare, _ := nodeFor(fmt.Sprintf("%s-spare-%d", ns, i), i)
		if err := create(ctx, cl, spare); err != nil {
			return nil, emuNode, err
		}
	}
	for _, app := range protectedApps(c) {
		if err := waitPDBAllows(ctx, cl, ns, app, c.drainReplicas); err != nil {
			return nil, emuNode, err
		}
	}
	return replicas, emuNode, nil
}

// waitPDBAllows waits until the PDB counts every replica healthy and allows
// one disruption.
func waitPDBAllows(ctx context.Context, cl client.Client, ns, name string, replicas int) error {
	err := harness.Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pdb policyv1.PodDisruptionBudget
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pdb); err != nil {
			return false, err
		}
		return pdb.Status.CurrentHealthy == int32(replicas) && pdb.Status.DisruptionsAllowed == 1, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for PDB %s/%s to allow 1 disruption: %w", ns, name, err)
	}
	return nil
}

// drainAlone builds a fresh node and lets one drainer empty it, nothing else
// running: kubectl drain, or kubectl delete node under nodeguard (started for
// this run and stopped after it). The drain starts, and the run returns, once
// every pod of the run is Ready and kube-controller-manager has gone quiet,
// so that each run has the cluster to itself.
func drainAlone(ctx context.Context, c config, env *harness.Env, tail *auditTail, profile, drainer string, rep, index int, cycle time.Duration) (*drainRun, error) {
	ctx, cancel := context.WithCancel(ctx) // stops this run's watches
	defer cancel()
	cl := env.Client
	ns := runNamespace(drainer, rep)
	target := ns + "-target"
	logf("drain %s: %s, repetition %d: building a node with %d pods", profile, drainer, rep, c.drainApps*c.drainReplicas+c.drainFree)
	replicas, emuNode, err := drainLayout(ctx, c, cl, ns, index, drainer == nodeguardDrainer)
	if err != nil {
		return nil, err
	}
	proxy, err := startAPIProxy(env, env.Dir, "drain-"+ns)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()
	if drainer == nodeguardDrainer {
		emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, []armemulator.Node{emuNode}, armemulator.Topology{Internal: true}), armemulator.Options{})
		if err != nil {
			return nil, err
		}
		defer emu.Close()
		ng, err := startNodeguard(c.nodeguard, env, proxy.Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-"+ns+".log"))
		if err != nil {
			return nil, err
		}
		defer ng.stop()
		if err := waitFinalizer(ctx, cl, target); err != nil {
			return nil, err
		}
	}
	tr, err := startPodTracker(ctx, env.Config, drainLabel+"="+ns, replicas)
	if err != nil {
		return nil, err
	}
	pw, err := startPDBWatch(ctx, env.Config, ns)
	if err != nil {
		return nil, err
	}

	if err := waitControllersQuiet(ctx, tail); err != nil {
		return nil, err
	}
	run := &drainRun{Drainer: drainer, Namespace: ns}
	if drainer == nodeguardDrainer {
		if run.PlanEstimate, err = planEstimate(ctx, cl, target, cycle); err != nil {
			return nil, err
		}
	}
	logf("drain %s: %s drains %s alone", profile, drainer, target)
	start := tr.begin(target)
	if drainer == kubectlDrainer {
		err = kubectlDrain(ctx, proxy.Kubeconfig, target, tr, start, run)
	} else {
		err = nodeguardDrain(ctx, env, target, tr, start, run)
	}
	if err != nil {
		return nil, err
	}
	if err := waitReadyOn(ctx, cl, ns, "", c.drainApps*c.drainReplicas+c.drainFree); err != nil {
		return nil, err
	}
	if err := waitControllersQuiet(ctx, tail); err != nil {
		return nil, err
	}
	if err := run.measure(c, env.AuditLog, proxy, tr, pw, target, start, time.Now()); err != nil {
		return nil, err
	}
	logf("drain %s: %s emptied its node in %s (%d of %d evictions refused)", profile, drainer, bench.Seconds(run.Empty), run.TooMany, run.Evictions)
	return run, nil
}

// planEstimate is what kubectl nodeguard plan estimates for draining node,
// with cycle as --pod-cycle and the bench's kube-controller-manager pace.
func planEstimate(ctx context.Context, cl client.Client, node string, cycle time.Duration) (time.Duration, error) {
	settings, from := plugin.ReadSettings(ctx, cl, "nodeguard-system") // nodeguard runs as a process here: its defaults
	pc := &plugin.Cluster{Client: cl, Settings: settings, Now: time.Now}
	plan, err := pc.Plan(ctx, []string{node}, plugin.PlanOptions{PodCycle: cycle, MaxConcurrentDrains: plugin.DefaultMaxConcurrentDrains,
		ControllerQPS: kcmClientQPS}, from)
	if err != nil {
		return 0, fmt.Errorf("kubectl nodeguard plan %s: %w", node, err)
	}
	return plan.Estimate, nil
}

// measure fills in what the run's proxy, pod tracker, PDB watch and the audit
// log recorded, from start; settled is when the controllers were done.
func (run *drainRun) measure(c config, auditLog string, proxy *harness.APIProxy, tr *podTracker, pw *pdbWatch, target string, start, settled time.Time) error {
	ns := run.Namespace
	apps := protectedApps(c)
	run.Timeline = tr.timeline(target)
	run.Empty = emptyAt(run.Timeline)
	run.Evicts = proxy.Evictions(ns)
	if t := firstEviction(proxy, ns); !t.IsZero() {
		run.FirstEviction = t.Sub(start)
	}
	run.Evictions = evictionsAnswered(proxy, ns, 0)
	run.TooMany = evictionsAnswered(proxy, ns, http.StatusTooManyRequests)
	run.MaxInFlight = maxInFlight(proxy, ns, apps)
	run.Wakeups = pw.wakeups(run.Evicts, ns, apps)
	for _, app := range apps {
		run.MaxUnavailable = max(run.MaxUnavailable, tr.maxUnavailable(ns+"/"+app))
		var sum time.Duration
		for _, d := range pw.cycles(run.Evicts, ns, app) {
			sum += d
		}
		run.OwnChain = max(run.OwnChain, sum)
	}
	if auditLog == "" || run.FirstEviction == 0 || run.Empty <= run.FirstEviction {
		return nil
	}
	var err error
	if run.Controllers, err = controllerLoads(auditLog, ns, start.Add(run.FirstEviction), start.Add(run.Empty)); err != nil {
		return err
	}
	run.Replacement, err = controllerLoads(auditLog, ns, start.Add(run.FirstEviction), settled)
	return err
}

// kubectlDrain runs kubectl drain on the node and waits until it exited and
// the node is empty.
func kubectlDrain(ctx context.Context, kubeconfig, node string, tr *podTracker, start time.Time, run *drainRun) error {
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", kubeconfig, "drain", node,
		"--ignore-daemonsets", "--delete-emptydir-data", "--timeout=15m")
	out, err := cmd.CombinedOutput()
	run.Done = time.Since(start)
	if err != nil {
		return fmt.Errorf("kubectl drain: %v: %s", err, out)
	}
	return waitEmpty(ctx, tr, node)
}

// nodeguardDrain deletes the node and waits until nodeguard released it and
// it is empty.
func nodeguardDrain(ctx context.Context, env *harness.Env, node string, tr *podTracker, start time.Time, run *drainRun) error {
	if out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig, "delete", "node", node, "--wait=false").CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl delete node: %v: %s", err, out)
	}
	err := harness.Poll(ctx, 15*time.Minute, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{})
		if client.IgnoreNotFound(err) != nil {
			return false, err
		}
		if err != nil && run.Done == 0 {
			run.Done = time.Since(start)
		}
		return run.Done > 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for nodeguard to release %s (%d pods left): %w", node, tr.left(node), err)
	}
	return waitEmpty(ctx, tr, node)
}

func waitEmpty(ctx context.Context, tr *podTracker, node string) error {
	err := harness.Poll(ctx, 15*time.Minute, func(context.Context) (bool, error) { return tr.left(node) == 0, nil })
	if err != nil {
		return fmt.Errorf("waiting for %s to be empty (%d pods left): %w", node, tr.left(node), err)
	}
	return nil
}

// idleCycles measures the cluster's own budget cycle with nothing else
// running: c.idleCycles times, one at a time, it evicts a pod of a
// Deployment under a maxUnavailable 1 PDB and times the eviction request to
// the PDB allowing a disruption again (the eviction, the replacement
// scheduled, started and Ready, the disruption controller's status write).
// Each eviction waits until the Deployment is fully available again and
// kube-controller-manager has gone quiet.
func idleCycles(ctx context.Context, c config, env *harness.Env, tail *auditTail) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx) // stops the PDB watch
	defer cancel()
	cl := env.Client
	const app = "cycle"
	if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cycleNS}}); err != nil {
		return nil, err
	}
	if err := create(ctx, cl, builder.Node(cycleNS+"-node", builder.WithLabels("group", cycleNS))); err != nil {
		return nil, err
	}
	if err := create(ctx, cl, drainDeployment(cycleNS, app, c.drainReplicas)); err != nil {
		return nil, err
	}
	if err := create(ctx, cl, builder.PDB(cycleNS, app, builder.MaxUnavailable("1"))); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return nil, err
	}
	pw, err := startPDBWatch(ctx, env.Config, cycleNS)
	if err != nil {
		return nil, err
	}
	var cycles []time.Duration
	for range c.idleCycles {
		if err := waitAvailable(ctx, cl, cycleNS, app, c.drainReplicas); err != nil {
			return nil, err
		}
		if err := waitPDBAllows(ctx, cl, cycleNS, app, c.drainReplicas); err != nil {
			return nil, err
		}
		if err := waitControllersQuiet(ctx, tail); err != nil {
			return nil, err
		}
		pod, err := readyPod(ctx, cl, cycleNS)
		if err != nil {
			return nil, err
		}
		sent := time.Now()
		if err := evictByName(ctx, cs, cycleNS, pod); err != nil {
			return nil, err
		}
		e := []harness.Eviction{{Namespace: cycleNS, Pod: pod, Workload: app, Start: sent, Status: http.StatusCreated}}
		var got []time.Duration
		if err := harness.Poll(ctx, 2*time.Minute, func(context.Context) (bool, error) {
			got = pw.cycles(e, cycleNS, app)
			return len(got) > 0, nil
		}); err != nil {
			return nil, fmt.Errorf("waiting for PDB %s/%s to allow again after evicting %s: %w", cycleNS, app, pod, err)
		}
		cycles = append(cycles, got[0])
	}
	return cycles, nil
}

// waitAvailable waits until the Deployment's status reports every replica
// available: the ReplicaSet and Deployment controllers are done with the last
// replacement.
func waitAvailable(ctx context.Context, cl client.Client, ns, name string, replicas int) error {
	return harness.Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var d appsv1.Deployment
		err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &d)
		return err == nil && d.Status.AvailableReplicas == int32(replicas) && d.Status.Replicas == int32(replicas), err
	})
}

// readyPod names a Ready pod of the namespace that is not being deleted.
func readyPod(ctx context.Context, cl client.Client, ns string) (string, error) {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return "", err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && podReady(p) {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("no Ready pod in %s", ns)
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
	d.Spec.Template.Labels[drainLabel] = ns
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

// pdbWatch records, from its own watch, when each PDB of the drain section
// went from allowing no disruption to allowing one: the moments a drainer
// whose queue waits on that PDB can send its next eviction.
type pdbWatch struct {
	mu      sync.Mutex
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
