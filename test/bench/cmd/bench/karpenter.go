package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Section 7: Karpenter side by side. Karpenter (its kwok provider, the
// version the e2e tests pin) owns one set of nodes, made from NodeClaims;
// nodeguard guards another set of the same size and pod layout in the same
// cluster. Each repetition deletes Karpenter's set through its NodeClaims
// and nodeguard's through node deletes, one after the other, alternating
// which goes first. The evicted pods go to spare nodes that neither touches.

const (
	karpenterNS   = "kbench"
	karpenterPool = "bench"
	// karpenterInstanceType is a kwok instance type of Karpenter's kwok
	// provider (4 CPUs).
	karpenterInstanceType = "c-4x-amd64-linux"
	// karpenterDeployments per set, one pod of each on every node of the set
	// (replicas = the set's nodes) under a maxUnavailable 10% PDB; the rest
	// of a node's pods are bare.
	karpenterDeployments = 4
	karpenterBarePerNode = 8
	// karpenterSpareLabel marks the spare nodes, where evicted pods go.
	karpenterSpare = "spare"
)

var (
	nodePoolGVK  = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodePool"}
	nodeClaimGVK = schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaim"}
	nodeClassGVK = schema.GroupVersionKind{Group: "karpenter.kwok.sh", Version: "v1alpha1", Kind: "KWOKNodeClass"}
)

type karpenterResult struct {
	SetNodes int `json:"setNodes"`
	Spares   int `json:"spares"`
	// Runs are each drainer's deletions, in the order they ran.
	Runs []karpenterRun `json:"runs"`
}

// karpenterRun is one drainer's deletion of its set in one repetition.
type karpenterRun struct {
	Rep     int    `json:"rep"`
	Drainer string `json:"drainer"` // karpenter or nodeguard
	First   bool   `json:"first"`
	fleetDeletion
}

const (
	drainerKarpenter = "karpenter"
	drainerNodeguard = "nodeguard"
)

func (r *karpenterResult) runsOf(drainer string) []karpenterRun {
	var out []karpenterRun
	for _, run := range r.Runs {
		if run.Drainer == drainer && run.Nodes > 0 {
			out = append(out, run)
		}
	}
	return out
}

// setName names a drainer's set of nodes in a repetition (the value of
// scaleSetLabel, which waitGone polls).
func setName(drainer string, rep int) string { return fmt.Sprintf("%s-%d", drainer, rep) }

// karpenterSection is the section's cluster and drainers.
type karpenterSection struct {
	c            config
	env          *harness.Env
	cl           client.Client
	ngAPI, kpAPI *requestCounter // each drainer's counting proxy
	kp           *karpenterProc
	spares       []string
	r            *karpenterResult
}

// runKarpenter runs the section in its own cluster.
func runKarpenter(ctx context.Context, c config, env *harness.Env) (*karpenterResult, error) {
	s := &karpenterSection{c: c, env: env, r: &karpenterResult{SetNodes: c.karpenterSet, Spares: c.karpenterSpares}}
	stop, err := s.start(ctx)
	defer stop()
	if err != nil {
		return nil, err
	}
	for rep := range c.karpenterReps {
		if ctx.Err() != nil {
			return s.r, ctx.Err()
		}
		if err := s.rep(ctx, rep); err != nil {
			return s.r, fmt.Errorf("repetition %d: %w", rep+1, err)
		}
	}
	return s.r, nil
}

// start installs Karpenter's CRDs and NodePool, starts the ARM emulator,
// both drainers behind their counting proxies and the spare nodes. stop
// undoes what started.
func (s *karpenterSection) start(ctx context.Context) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if s.cl, err = fastClient(s.env); err != nil {
		return stop, err
	}
	if err := harness.ApplyKarpenterCRDs(ctx, s.cl); err != nil {
		return stop, err
	}
	if err := create(ctx, s.cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: karpenterNS}}); err != nil {
		return stop, err
	}
	if err := createKarpenterPool(ctx, s.cl, s.c.karpenterSet); err != nil {
		return stop, err
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, s.emulatedNodes(), armemulator.Topology{Internal: true}), armemulator.Options{})
	if err != nil {
		return stop, err
	}
	stops = append(stops, func() { _ = emu.Close() })
	for _, api := range []struct {
		counter **requestCounter
		file    string
	}{{&s.ngAPI, "karpenter-section-nodeguard.kubeconfig"}, {&s.kpAPI, "karpenter-section-karpenter.kubeconfig"}} {
		if *api.counter, err = startRequestCounter(s.env.Config, filepath.Join(s.env.Dir, api.file)); err != nil {
			return stop, err
		}
		stops = append(stops, (*api.counter).close)
	}
	ng, err := startNodeguard(s.c.nodeguard, s.env, s.ngAPI.Kubeconfig, emu.URL(), filepath.Join(s.env.Dir, "nodeguard-karpenter-section.log"))
	if err != nil {
		return stop, err
	}
	stops = append(stops, ng.stop)
	s.kp = &karpenterProc{kubeconfig: s.kpAPI.Kubeconfig, dir: s.env.Dir}
	if err := s.kp.start(); err != nil {
		return stop, err
	}
	stops = append(stops, s.kp.stop)
	if err := create(ctx, s.cl, builder.NDB("karpenter-section", builder.NDBSelecting(managedLabel, "true"), builder.NDBMaxUnavailable("100%"))); err != nil {
		return stop, err
	}
	logf("karpenter: %d spare nodes", s.c.karpenterSpares)
	s.spares = make([]string, s.c.karpenterSpares)
	for i := range s.spares {
		s.spares[i] = fmt.Sprintf("kspare-%03d", i)
	}
	return stop, createSpares(ctx, s.cl, s.spares)
}

// emulatedNodes are nodeguard's nodes of every repetition, known ahead, for
// the ARM emulator: nodeguard cuts their traffic as on AKS.
func (s *karpenterSection) emulatedNodes() []armemulator.Node {
	var nodes []armemulator.Node
	for rep := range s.c.karpenterReps {
		for i := range s.c.karpenterSet {
			nodes = append(nodes, armemulator.Node{Name: nodeguardSetNode(rep, i), IPs: []string{karpenterNodeIP(rep, i)}})
		}
	}
	return nodes
}

// rep builds both sets of a repetition, deletes each with its drainer in
// this repetition's order, then removes the repetition's Deployments.
func (s *karpenterSection) rep(ctx context.Context, rep int) error {
	logf("karpenter: repetition %d: %d nodes per set", rep+1, s.c.karpenterSet)
	sets, err := s.place(ctx, rep)
	if err != nil {
		return err
	}
	order := []string{drainerKarpenter, drainerNodeguard}
	if rep%2 == 1 {
		slices.Reverse(order)
	}
	for i, drainer := range order {
		if err := waitDeploymentsWhole(ctx, s.cl, karpenterNS); err != nil {
			return err
		}
		f, err := s.delete(ctx, rep, drainer, sets[drainer])
		if f != nil {
			s.r.Runs = append(s.r.Runs, karpenterRun{Rep: rep, Drainer: drainer, First: i == 0, fleetDeletion: *f})
		}
		if err != nil {
			return fmt.Errorf("%s: %w", drainer, err)
		}
		logf("karpenter: %s released %d nodes in %s", drainer, f.Nodes, bench.Seconds(f.Released))
	}
	return deleteSetWorkloads(ctx, s.cl, setName(drainerNodeguard, rep), setName(drainerKarpenter, rep))
}

// place creates both sets of a repetition and their pods, and returns each
// drainer's nodes. The spares are cordoned meanwhile, so that the topology
// spread puts one pod of each Deployment on every node of a set.
func (s *karpenterSection) place(ctx context.Context, rep int) (map[string][]string, error) {
	if err := setSchedulable(ctx, s.cl, s.spares, false); err != nil {
		return nil, err
	}
	ngNodes, err := createNodeguardSet(ctx, s.cl, rep, s.c.karpenterSet)
	if err != nil {
		return nil, err
	}
	kpNodes, err := createKarpenterSet(ctx, s.cl, rep, s.c.karpenterSet)
	if err != nil {
		return nil, err
	}
	for _, drainer := range []string{drainerNodeguard, drainerKarpenter} {
		if err := createSetPods(ctx, s.cl, setName(drainer, rep), s.c.karpenterSet); err != nil {
			return nil, err
		}
	}
	if err := createBareOn(ctx, s.cl, append(slices.Clone(ngNodes), kpNodes...)); err != nil {
		return nil, err
	}
	n := s.c.karpenterSet
	if _, err := waitRunning(ctx, s.cl, karpenterNS, 2*karpenterDeployments*n, karpenterBarePerNode*(2*n+len(s.spares))); err != nil {
		return nil, err
	}
	if err := setSchedulable(ctx, s.cl, s.spares, true); err != nil {
		return nil, err
	}
	if err := waitFinalizers(ctx, s.cl, ngNodes); err != nil {
		return nil, err
	}
	return map[string][]string{drainerNodeguard: ngNodes, drainerKarpenter: kpNodes}, nil
}

// delete deletes one drainer's set and measures it.
func (s *karpenterSection) delete(ctx context.Context, rep int, drainer string, nodes []string) (*fleetDeletion, error) {
	set := setName(drainer, rep)
	tracker, stop, err := watchSetBudgets(ctx, s.env, set, s.c.karpenterSet)
	if err != nil {
		return nil, err
	}
	defer stop()
	tracker.begin()
	var f *fleetDeletion
	if drainer == drainerNodeguard {
		f, err = deleteSet(ctx, s.cl, s.ngAPI, set, nodes, deleteNodes(s.ngAPI), nil)
	} else {
		f, err = deleteSet(ctx, s.cl, s.kpAPI, set, nodes, deleteNodeClaims(s.kpAPI, rep, s.c.karpenterSet), s.kp.restart)
	}
	if f != nil {
		f.Budgets = tracker.result()
	}
	return f, err
}

func fastClient(env *harness.Env) (client.Client, error) {
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 2000, 2000
	return client.New(&cfg, client.Options{Scheme: env.Scheme})
}

// createKarpenterPool creates the KWOKNodeClass and a NodePool that never
// disrupts on its own (budget 0, no consolidation, no expiry) and launches
// nothing for pending pods (a node limit of one set's size, which the
// hand-made NodeClaims fill).
func createKarpenterPool(ctx context.Context, cl client.Client, limit int) error {
	class := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
	class.SetGroupVersionKind(nodeClassGVK)
	class.SetName(karpenterPool)
	if err := create(ctx, cl, class); err != nil {
		return err
	}
	pool := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"template": map[string]any{"spec": map[string]any{
			"nodeClassRef": map[string]any{"group": nodeClassGVK.Group, "kind": nodeClassGVK.Kind, "name": karpenterPool},
			"requirements": karpenterRequirements(),
			"expireAfter":  "Never",
		}},
		"disruption": map[string]any{
			"consolidationPolicy": "WhenEmpty",
			"consolidateAfter":    "Never",
			"budgets":             []any{map[string]any{"nodes": "0"}},
		},
		"limits": map[string]any{"nodes": fmt.Sprint(limit)},
	}}}
	pool.SetGroupVersionKind(nodePoolGVK)
	pool.SetName(karpenterPool)
	return create(ctx, cl, pool)
}

func karpenterRequirements() []any {
	return []any{
		map[string]any{"key": corev1.LabelInstanceTypeStable, "operator": "In", "values": []any{karpenterInstanceType}},
		map[string]any{"key": "karpenter.sh/capacity-type", "operator": "In", "values": []any{"on-demand"}},
	}
}

func karpenterClaimName(rep, i int) string { return fmt.Sprintf("kclaim-%d-%03d", rep, i) }
func nodeguardSetNode(rep, i int) string   { return fmt.Sprintf("kng-%d-%03d", rep, i) }
func karpenterNodeIP(rep, i int) string    { return fmt.Sprintf("10.60.%d.%d", rep*4+i/250, i%250+1) }

// createKarpenterSet creates the repetition's NodeClaims, waits until each
// has its Node registered and Ready, labels the nodes with their set, and
// returns their names.
func createKarpenterSet(ctx context.Context, cl client.Client, rep, n int) ([]string, error) {
	set := setName(drainerKarpenter, rep)
	claims := make([]string, n)
	for i := range claims {
		claims[i] = karpenterClaimName(rep, i)
	}
	if err := forEach(ctx, claims, 16, func(ctx context.Context, name string) error {
		nc := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
			"nodeClassRef": map[string]any{"group": nodeClassGVK.Group, "kind": nodeClassGVK.Kind, "name": karpenterPool},
			"requirements": karpenterRequirements(),
			"expireAfter":  "Never",
		}}}
		nc.SetGroupVersionKind(nodeClaimGVK)
		nc.SetName(name)
		nc.SetLabels(map[string]string{"karpenter.sh/nodepool": karpenterPool, scaleSetLabel: set})
		nc.SetAnnotations(map[string]string{"karpenter.sh/do-not-disrupt": "true"})
		return create(ctx, cl, nc)
	}); err != nil {
		return nil, err
	}
	var nodes []string
	err := harness.PollEvery(ctx, time.Second, 10*time.Minute, func(ctx context.Context) (bool, error) {
		nodes = nodes[:0]
		for _, name := range claims {
			nc := &unstructured.Unstructured{}
			nc.SetGroupVersionKind(nodeClaimGVK)
			if err := cl.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
				return false, err
			}
			node, _, _ := unstructured.NestedString(nc.Object, "status", "nodeName")
			if node == "" {
				return false, nil
			}
			nodes = append(nodes, node)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("Karpenter's NodeClaims got no nodes: %w", err)
	}
	if err := forEach(ctx, nodes, 16, func(ctx context.Context, name string) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		return cl.Patch(ctx, n, client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, scaleSetLabel, set))))
	}); err != nil {
		return nil, err
	}
	return nodes, waitSetReady(ctx, cl, set, n)
}

// createNodeguardSet creates the repetition's nodeguard nodes, managed.
func createNodeguardSet(ctx context.Context, cl client.Client, rep, n int) ([]string, error) {
	set := setName(drainerNodeguard, rep)
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = nodeguardSetNode(rep, i)
	}
	ips := map[string]string{}
	for i, name := range nodes {
		ips[name] = karpenterNodeIP(rep, i)
	}
	if err := forEach(ctx, nodes, 16, func(ctx context.Context, name string) error {
		return create(ctx, cl, builder.Node(name, builder.WithInternalIP(ips[name]),
			builder.WithLabels(scaleSetLabel, set, managedLabel, "true")))
	}); err != nil {
		return nil, err
	}
	return nodes, waitSetReady(ctx, cl, set, n)
}

// createSpares creates the spare nodes, unmanaged, with their bare pods.
func createSpares(ctx context.Context, cl client.Client, spares []string) error {
	if err := forEach(ctx, spares, 16, func(ctx context.Context, name string) error {
		return create(ctx, cl, builder.Node(name, builder.WithLabels(scaleSetLabel, karpenterSpare)))
	}); err != nil {
		return err
	}
	if err := waitSetReady(ctx, cl, karpenterSpare, len(spares)); err != nil {
		return err
	}
	if err := createBareOn(ctx, cl, spares); err != nil {
		return err
	}
	_, err := waitRunning(ctx, cl, karpenterNS, 0, karpenterBarePerNode*len(spares))
	return err
}

func waitSetReady(ctx context.Context, cl client.Client, set string, n int) error {
	return harness.PollEvery(ctx, time.Second, 10*time.Minute, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes, client.MatchingLabels{scaleSetLabel: set}); err != nil {
			return false, err
		}
		ready := 0
		for i := range nodes.Items {
			if down, _ := budget.Unavailable(&nodes.Items[i], nil); !down && len(nodes.Items[i].Spec.Taints) == 0 {
				ready++
			}
		}
		return ready == n, nil
	})
}

// createSetPods creates the set's Deployments, one pod of each on every node
// of the set, and their PDBs. Their pods may go to the set's nodes and the
// spares only.
func createSetPods(ctx context.Context, cl client.Client, set string, nodes int) error {
	for d := range karpenterDeployments {
		app := fmt.Sprintf("web-%s-%d", set, d)
		dep := builder.Deployment(karpenterNS, app, int32(nodes), onSetOrSpare(set, app))
		if err := create(ctx, cl, dep); err != nil {
			return err
		}
		if err := create(ctx, cl, builder.PDB(karpenterNS, app, builder.MaxUnavailable("10%"))); err != nil {
			return err
		}
	}
	return nil
}

// onSetOrSpare keeps a Deployment's pods on its set's nodes and the spares,
// one per node while the spares are cordoned (taints honored by the spread).
func onSetOrSpare(set, app string) builder.WorkloadOption {
	return func(d *appsv1.Deployment) {
		spec := &d.Spec.Template.Spec
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: scaleSetLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{set, karpenterSpare}}},
			}}},
		}}
		honor := corev1.NodeInclusionPolicyHonor
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			NodeTaintsPolicy: &honor,
		}}
	}
}

// createBareOn creates karpenterBarePerNode bare pods on each node.
func createBareOn(ctx context.Context, cl client.Client, nodes []string) error {
	return forEach(ctx, nodes, 16, func(ctx context.Context, node string) error {
		for j := range karpenterBarePerNode {
			if err := create(ctx, cl, barePod(karpenterNS, fmt.Sprintf("filler-%s-%d", node, j), node)); err != nil {
				return err
			}
		}
		return nil
	})
}

// setSchedulable uncordons the nodes, or cordons them, 16 at a time.
func setSchedulable(ctx context.Context, cl client.Client, nodes []string, schedulable bool) error {
	return forEach(ctx, nodes, 16, func(ctx context.Context, name string) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		return cl.Patch(ctx, n, client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, !schedulable))))
	})
}

func waitFinalizers(ctx context.Context, cl client.Client, nodes []string) error {
	return forEach(ctx, nodes, 16, func(ctx context.Context, n string) error { return waitFinalizer(ctx, cl, n) })
}

// watchSetBudgets watches the set's Deployments' pods for budgetWatch.
func watchSetBudgets(ctx context.Context, env *harness.Env, set string, replicas int) (*budgetTracker, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	var workloads []string
	for d := range karpenterDeployments {
		workloads = append(workloads, fmt.Sprintf("%s/web-%s-%d", karpenterNS, set, d))
	}
	b, err := watchBudgets(ctx, env, workloads, replicas, max(replicas/10, 1))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return b, cancel, nil
}

// deleteNodes deletes the nodes at once through the drainer's counter, one
// request each as an autoscaler does, retrying the ones the webhook denies.
func deleteNodes(api *requestCounter) func(context.Context, []string) (deleteRetries, error) {
	return func(ctx context.Context, nodes []string) (deleteRetries, error) {
		cl, err := counterClient(api)
		if err != nil {
			return deleteRetries{}, err
		}
		return deleteRetrying(ctx, cl, nodes)
	}
}

// deleteNodeClaims deletes the repetition's NodeClaims at once through the
// drainer's counter, as a user (or a script) deleting Karpenter's nodes does.
func deleteNodeClaims(api *requestCounter, rep, n int) func(context.Context, []string) (deleteRetries, error) {
	return func(ctx context.Context, _ []string) (deleteRetries, error) {
		cl, err := counterClient(api)
		if err != nil {
			return deleteRetries{}, err
		}
		claims := make([]string, n)
		for i := range claims {
			claims[i] = karpenterClaimName(rep, i)
		}
		return deleteRetries{}, forEach(ctx, claims, len(claims), func(ctx context.Context, name string) error {
			nc := &unstructured.Unstructured{}
			nc.SetGroupVersionKind(nodeClaimGVK)
			nc.SetName(name)
			return client.IgnoreNotFound(cl.Delete(ctx, nc))
		})
	}
}

func counterClient(api *requestCounter) (client.Client, error) {
	cfg, err := counterConfig(api)
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{})
}

// counterConfig points a client at the proxy, with a client limit (1,000
// requests a second) that no bench client reaches.
func counterConfig(api *requestCounter) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	return cfg, nil
}

// deleteSet starts the deletion of a set and waits until every node of it
// is gone, counting the drainer's requests over the window. When no node
// has gone for drainStall, restart (if any) restarts the drainer, as an
// operator would, and the wait goes on.
func deleteSet(ctx context.Context, cl client.Client, api *requestCounter, set string, nodes []string,
	start func(context.Context, []string) (deleteRetries, error), restart func() error) (*fleetDeletion, error) {
	pods, err := podsOn(ctx, cl, nodes)
	if err != nil {
		return nil, err
	}
	f := &fleetDeletion{Nodes: len(nodes), setPods: pods}
	before := api.snapshot()
	began := time.Now()
	if f.Retries, err = start(ctx, nodes); err != nil {
		return nil, err
	}
	gone, err := waitGoneRestarting(ctx, cl, set, began, len(nodes), restart, &f.Restarts)
	f.API = api.snapshot().since(before)
	f.Released, f.Median, f.Gone = gone[len(gone)-1], gone[len(gone)/2], gone
	return f, err
}

func (f *fleetDeletion) median() time.Duration { return f.Median }

// mostReleased is when all but a twentieth of the set was gone: the
// drainer's pace without its slowest nodes (a stalled one among them).
func (f *fleetDeletion) mostReleased() time.Duration {
	if len(f.Gone) == 0 {
		return f.Released
	}
	return f.Gone[(len(f.Gone)*95+99)/100-1]
}

// drainStall is how long a set may go without a node gone before its
// drainer is restarted. Karpenter v1.14.1 never evicts a pod again once
// an eviction of it was answered 409 (kube-apiserver's answer after 20 PDB
// update conflicts in 10 s, which Karpenter's hundreds of concurrent
// evictions under one PDB cause): its eviction queue returns without
// forgetting the pod, and the node drains forever until Karpenter restarts
// (kubernetes-sigs/karpenter#3144).
const drainStall = time.Minute

// waitGoneRestarting is waitGone with the stall restart.
func waitGoneRestarting(ctx context.Context, cl client.Client, set string, start time.Time, n int, restart func() error, restarts *int) ([]time.Duration, error) {
	var gone []time.Duration
	progress := time.Now()
	err := harness.PollEvery(ctx, 250*time.Millisecond, 20*time.Minute, func(ctx context.Context) (bool, error) {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes, client.MatchingLabels{scaleSetLabel: set}); err != nil {
			return false, err
		}
		for len(gone) < n-len(nodes.Items) {
			gone, progress = append(gone, time.Since(start)), time.Now()
		}
		if len(nodes.Items) > 0 && restart != nil && time.Since(progress) > drainStall {
			logf("karpenter: no node of %s gone for %s, %d left: restarting the drainer", set, drainStall, len(nodes.Items))
			if err := restart(); err != nil {
				return false, err
			}
			*restarts++
			progress = time.Now()
		}
		return len(nodes.Items) == 0, nil
	})
	for len(gone) < n {
		gone = append(gone, time.Since(start))
	}
	return gone, err
}

// karpenterProc is Karpenter's controller, which the bench may restart.
type karpenterProc struct {
	kubeconfig, dir string
	starts          int
	p               *harness.Nodeguard
}

func (k *karpenterProc) start() error {
	k.starts++
	p, err := harness.StartKarpenterProcess(k.kubeconfig, filepath.Join(k.dir, fmt.Sprintf("karpenter-%d.log", k.starts)))
	k.p = p
	return err
}

func (k *karpenterProc) stop() {
	if k.p != nil {
		_ = k.p.Stop(10 * time.Second)
	}
}

func (k *karpenterProc) restart() error {
	k.stop()
	return k.start()
}

// deleteSetWorkloads deletes the repetition's Deployments and PDBs and
// waits until their pods (on the spares) are gone, so that the next
// repetition starts on a quiet cluster.
func deleteSetWorkloads(ctx context.Context, cl client.Client, sets ...string) error {
	var apps []string
	for _, set := range sets {
		for d := range karpenterDeployments {
			apps = append(apps, fmt.Sprintf("web-%s-%d", set, d))
		}
	}
	bg := metav1.DeletePropagationBackground
	for _, app := range apps {
		if err := client.IgnoreNotFound(cl.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: karpenterNS, Name: app}}, &client.DeleteOptions{PropagationPolicy: &bg})); err != nil {
			return err
		}
		if err := client.IgnoreNotFound(cl.Delete(ctx, builder.PDB(karpenterNS, app, builder.MaxUnavailable("10%")))); err != nil {
			return err
		}
	}
	sel, err := labels.Parse(fmt.Sprintf("app in (%s)", strings.Join(apps, ",")))
	if err != nil {
		return err
	}
	return harness.PollEvery(ctx, time.Second, 10*time.Minute, func(ctx context.Context) (bool, error) {
		var pods metav1.PartialObjectMetadataList
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		err := cl.List(ctx, &pods, client.InNamespace(karpenterNS), client.MatchingLabelsSelector{Selector: sel})
		return err == nil && len(pods.Items) == 0, err
	})
}
