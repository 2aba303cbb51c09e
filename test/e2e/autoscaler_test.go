package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// clusterAutoscaler plays cluster-autoscaler's scale-down of a set of nodes
// (core/scaledown/actuation: StartDeletion, then one deletion per node in its
// own goroutine), step by step:
//  1. it picks the nodes: their objects as they are now are what it later
//     decides on (its cluster snapshot);
//  2. it taints every picked node ToBeDeletedByClusterAutoscaler (value: the
//     Unix time, effect NoSchedule) before any is deleted;
//  3. per node: it drains through the Eviction API, retrying refused
//     evictions, then waits for the pods to be gone;
//  4. WaitForDelayDeletion: only if the picked (pre-taint) node carried a
//     delay-deletion.cluster-autoscaler.kubernetes.io/* annotation, it polls a
//     fresh node (every 5 s in cluster-autoscaler; poll here) until none is
//     left or delayTimeout passes (--node-deletion-delay-timeout, 2 min by
//     default); past it, it logs a warning and goes on: a timeout is no error;
//  5. it deletes the VM (here, in the ARM emulator);
//  6. the Node is deleted afterwards by the cloud node lifecycle controller
//     (cloudNodeController in deleters_test.go) once the node is NotReady: the
//     actor plays the kubelet dying with its VM (kwok stops playing it, Ready
//     turns Unknown).
//
// A drain whose evictions are still refused after maxPodEvictionTime fails:
// cluster-autoscaler then removes its taint and keeps the node (the
// scale-down is abandoned, its VM stays).
//
// Shortened for a test: poll, delayTimeout and maxPodEvictionTime are
// parameters, and the eviction retry is 1 s (cluster-autoscaler's is 10 s).
type clusterAutoscaler struct {
	f            *fleet
	poll         time.Duration
	delayTimeout time.Duration
	// maxPodEvictionTime is --max-pod-eviction-time (2 min by default).
	maxPodEvictionTime time.Duration

	mu sync.Mutex
	// vmDeleted: when each node's VM was deleted; nodeGone: when its Node was
	// seen gone afterwards.
	vmDeleted map[string]time.Time
	// overlaps: a VM deleted while another picked node's VM was gone and its
	// Node still there (two disruptions at once).
	overlaps []string
	// notDown: a VM deleted while one of its entries was not Down;
	// evictedEarly: a pod evicted while one was not.
	notDown, evictedEarly []string
	// waits: per node, how long the delay-deletion wait took, how many polls,
	// and whether it timed out.
	waits map[string]delayWait
	// abandoned: the nodes whose drain failed, kept by cluster-autoscaler.
	abandoned map[string]bool
}

type delayWait struct {
	took     time.Duration
	polls    int
	timedOut bool
}

func newClusterAutoscaler(f *fleet, poll, delayTimeout time.Duration) *clusterAutoscaler {
	return &clusterAutoscaler{f: f, poll: poll, delayTimeout: delayTimeout, maxPodEvictionTime: 2 * time.Minute,
		vmDeleted: map[string]time.Time{}, waits: map[string]delayWait{}, abandoned: map[string]bool{}}
}

// scaleDown runs the scale-down of nodes and returns when every VM is
// deleted.
func (ca *clusterAutoscaler) scaleDown(t *testing.T, nodes ...string) {
	t.Helper()
	ctx := context.Background()
	picked := map[string]*corev1.Node{}
	for _, name := range nodes {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		picked[name] = &n
	}
	for _, name := range nodes {
		patchTaints(t, name, func(ts []corev1.Taint) []corev1.Taint {
			return append(ts, corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey,
				Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule})
		})
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	for _, name := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ca.deleteNode(ctx, t, picked[name]); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (ca *clusterAutoscaler) deleteNode(ctx context.Context, t *testing.T, picked *corev1.Node) error {
	if err := ca.drain(ctx, picked.Name); errors.Is(err, errDrainTimedOut) {
		// cluster-autoscaler's failed drain: the taint goes, the node stays.
		t.Logf("cluster-autoscaler: failed to drain %s (pods remaining after %s): scale-down abandoned", picked.Name, ca.maxPodEvictionTime)
		patchTaints(t, picked.Name, func(ts []corev1.Taint) []corev1.Taint {
			return slices.DeleteFunc(ts, func(x corev1.Taint) bool { return x.Key == ngv1alpha1.ClusterAutoscalerTaintKey })
		})
		ca.mu.Lock()
		ca.abandoned[picked.Name] = true
		ca.mu.Unlock()
		return nil
	} else if err != nil {
		return err
	}
	ca.waitForDelayDeletion(ctx, t, picked)
	ca.deleteVM(ctx, t, picked)
	return ca.kubeletDies(ctx, picked.Name)
}

// errDrainTimedOut: pods remained after maxPodEvictionTime.
var errDrainTimedOut = errors.New("pods remaining after the eviction timeout")

// drain evicts every pod but mirror and DaemonSet pods, retrying refusals,
// then waits until they are gone.
func (ca *clusterAutoscaler) drain(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeoutCause(ctx, ca.maxPodEvictionTime, errDrainTimedOut)
	defer cancel()
	for {
		pods, err := podsToEvict(ctx, node)
		if err != nil {
			return err
		}
		if len(pods) == 0 {
			return nil
		}
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				continue
			}
			err := env.Client.SubResource("eviction").Create(ctx, &p, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsTooManyRequests(err) {
				return fmt.Errorf("evicting %s: %w", p.Name, err)
			}
			if err == nil && !ca.f.allStates(node, "Down") {
				ca.mu.Lock()
				ca.evictedEarly = append(ca.evictedEarly, fmt.Sprintf("%s from %s: %v", p.Name, node, ca.f.states(node)))
				ca.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %w", context.Cause(ctx))
		case <-time.After(time.Second):
		}
	}
}

func podsToEvict(ctx context.Context, node string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		owner := metav1.GetControllerOf(&p)
		if p.Annotations[corev1.MirrorPodAnnotationKey] != "" || owner != nil && owner.Kind == "DaemonSet" ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// waitForDelayDeletion is cluster-autoscaler's WaitForDelayDeletion.
func (ca *clusterAutoscaler) waitForDelayDeletion(ctx context.Context, t *testing.T, picked *corev1.Node) {
	if !hasDelayDeletion(picked) {
		ca.record(picked.Name, delayWait{})
		return
	}
	start := time.Now()
	w := delayWait{}
	for {
		w.polls++
		var fresh corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: picked.Name}, &fresh); err == nil && !hasDelayDeletion(&fresh) {
			break
		}
		if time.Since(start) >= ca.delayTimeout {
			w.timedOut = true
			t.Logf("cluster-autoscaler: delay node deletion timed out for node %s after %s (%d polls): deleting it anyway", picked.Name, ca.delayTimeout, w.polls)
			break
		}
		time.Sleep(ca.poll)
	}
	w.took = time.Since(start)
	ca.record(picked.Name, w)
}

func hasDelayDeletion(n *corev1.Node) bool {
	for k := range n.Annotations {
		if strings.HasPrefix(k, "delay-deletion.cluster-autoscaler.kubernetes.io/") {
			return true
		}
	}
	return false
}

func (ca *clusterAutoscaler) record(node string, w delayWait) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.waits[node] = w
}

// deleteVM deletes the node's VM, first noting whether any other picked
// node is disrupted (VM gone, Node still there) and whether the node's
// entries are all Down.
func (ca *clusterAutoscaler) deleteVM(ctx context.Context, t *testing.T, picked *corev1.Node) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	for other := range ca.vmDeleted {
		if gone, err := harness.NodeGone(ctx, env.Client, other); err == nil && !gone {
			ca.overlaps = append(ca.overlaps, fmt.Sprintf("%s's VM deleted while %s's VM is gone and its Node still there", picked.Name, other))
		}
	}
	if !ca.f.allStates(picked.Name, "Down") {
		ca.notDown = append(ca.notDown, fmt.Sprintf("%s: %v", picked.Name, ca.f.states(picked.Name)))
	}
	if !ca.f.emulator.DeleteVM(picked.Spec.ProviderID) {
		t.Errorf("the emulator held no VM %s for %s", picked.Spec.ProviderID, picked.Name)
	}
	ca.vmDeleted[picked.Name] = time.Now()
	t.Logf("cluster-autoscaler: deleted the VM of %s", picked.Name)
}

// kubeletDies plays the node's kubelet going with its VM: kwok stops playing
// it and its Ready condition turns Unknown, as the node lifecycle controller
// sets it.
func (ca *clusterAutoscaler) kubeletDies(ctx context.Context, node string) error {
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	delete(n.Annotations, builder.KwokAnnotation)
	if err := env.Client.Patch(ctx, &n, patch); err != nil {
		return client.IgnoreNotFound(err)
	}
	statusPatch := client.MergeFrom(n.DeepCopy())
	builder.Unreachable()(&n)
	n.Status.Conditions = slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == corev1.NodeReady && c.Status != corev1.ConditionUnknown
	})
	return client.IgnoreNotFound(env.Client.Status().Patch(ctx, &n, statusPatch))
}

// TestClusterAutoscalerScaleDownFollowsTheBudget: cluster-autoscaler scales
// 3 of 4 nodes down at once under a NodeDisruptionBudget of maxUnavailable 1.
// nodeguard's hold lets one VM go at a time: each VM is deleted only after
// the previous node is gone, and only once its entries are Down, and no pod
// is evicted before its node's entries are Down; no node is
// left tainted or annotated by a scale-down afterwards, and the survivor
// carries nothing but the standing hold.
func TestClusterAutoscalerScaleDownFollowsTheBudget(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	f := newFleet(t, "cascale", 4)
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.pool}})
	harness.MustCreate(t, env.Client, builder.Deployment(f.pool, "web", 4, builder.OnNodes("pool", f.pool)))
	harness.MustCreate(t, env.Client, builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("1")))
	startNodeguard(t, env.Kubeconfig, f.emulator)
	for _, n := range f.nodes {
		waitForHold(t, n)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		ready := 0
		for _, n := range f.nodes {
			pods, err := evictablePodsOn(ctx, f.pool, n)
			if err != nil {
				return false, err
			}
			ready += len(pods)
		}
		return ready == 4, nil
	}, "4 pods run on the pool")
	ccm := &cloudNodeController{emulator: f.emulator, pool: f.pool}
	ccm.run(t)

	ca := newClusterAutoscaler(f, 500*time.Millisecond, 90*time.Second)
	start := time.Now()
	ca.scaleDown(t, f.nodes[:3]...)
	for _, n := range f.nodes[:3] {
		harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
			return harness.NodeGone(ctx, env.Client, n)
		}, "%s is gone", n)
	}
	t.Logf("3 nodes scaled down in %s", time.Since(start).Round(100*time.Millisecond))
	for _, n := range f.nodes[:3] {
		w := ca.waits[n]
		t.Logf("%s: held %s (%d polls of the delay-deletion wait)", n, w.took.Round(100*time.Millisecond), w.polls)
		if w.timedOut {
			t.Errorf("%s: cluster-autoscaler's delay-deletion wait timed out: nodeguard never released the hold", n)
		}
	}
	for _, o := range ca.overlaps {
		t.Errorf("two nodes disrupted at once: %s", o)
	}
	for _, d := range ca.notDown {
		t.Errorf("VM deleted before its entries were Down: %s", d)
	}
	for _, e := range ca.evictedEarly {
		t.Errorf("pod evicted before its node's entries were Down (traffic first): %s", e)
	}
	for _, n := range f.nodes[:3] {
		waitForEventNote(t, n, "ScaleDownReleased", ngv1alpha1.DelayDeletionAnnotation)
	}

	survivor := f.nodes[3]
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: survivor}, &n); err != nil {
			return false, err
		}
		return len(leftovers(&n)) == 0, nil
	}, "the survivor %s carries nothing from the scale-down", survivor)
	// The status controller gives a charge back once it sees the node gone:
	// moments after the test does, not before.
	harness.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: f.pool}, &ndb)
		return len(ndb.Status.DisruptedNodes) == 0, err
	}, "the budget gives back the charges of the nodes scaled down")
}

// leftovers lists what a scale-down left on a node: the scale-down taint,
// nodeguard's draining taint, its claim mark, its scale-down-disabled, and a
// hold other than the standing one.
func leftovers(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		if t.Key == ngv1alpha1.ClusterAutoscalerTaintKey || ngv1alpha1.IsDrainingTaint(t) {
			out = append(out, "taint "+t.Key)
		}
	}
	for _, a := range []string{ngv1alpha1.ScaleDownClaimedAnnotation, ngv1alpha1.ScaleDownDisabledByAnnotation, ngv1alpha1.ScaleDownDisabledAnnotation} {
		if _, ok := n.Annotations[a]; ok {
			out = append(out, "annotation "+a)
		}
	}
	if v := n.Annotations[ngv1alpha1.DelayDeletionAnnotation]; v != ngv1alpha1.DelayDeletionValue {
		out = append(out, fmt.Sprintf("hold %q", v))
	}
	return out
}

func waitForHold(t *testing.T, node string) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
		return n.Annotations[ngv1alpha1.DelayDeletionAnnotation] == ngv1alpha1.DelayDeletionValue, err
	}, "%s carries nodeguard's standing delay-deletion hold", node)
}

// useUpBudget takes the pool's budget (maxUnavailable 1) with another node
// leaving (out-of-service taint, removed at cleanup), and waits until the
// budget allows no disruption.
func useUpBudget(t *testing.T, f *fleet, leaving string) {
	t.Helper()
	patchTaints(t, leaving, func(ts []corev1.Taint) []corev1.Taint {
		return append(ts, corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	})
	t.Cleanup(func() {
		patchTaints(t, leaving, func(ts []corev1.Taint) []corev1.Taint {
			return slices.DeleteFunc(ts, func(x corev1.Taint) bool { return x.Key == ngv1alpha1.OutOfServiceTaintKey })
		})
	})
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: f.pool}, &ndb)
		return err == nil && ndb.Status.ObservedGeneration == ndb.Generation && ndb.Status.DisruptionsAllowed == 0, err
	}, "the budget allows no disruption")
}

// TestClusterAutoscalerDeniedScaleDown measures what a denied scale-down
// does: the budget (maxUnavailable 1) is used up by another node leaving
// (out-of-service taint), cluster-autoscaler scales a node down, nodeguard
// denies the claim and keeps the hold; cluster-autoscaler waits out its
// delay-deletion timeout (shortened here) and then, as its code does, deletes
// the VM anyway. The test reports how long the VM was held and how many
// claims were denied; it asserts that the hold stood for the whole wait and
// that the entries were Down before the VM went. (With the budget used up
// nodeguard also marks the pool's nodes scale-down-disabled, which a real
// cluster-autoscaler checks when it picks nodes; the actor picks regardless,
// as one that picked just before the budget filled up would.)
func TestClusterAutoscalerDeniedScaleDown(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	f := newFleet(t, "cadenied", 3)
	target, leaving := f.nodes[0], f.nodes[1]
	harness.MustCreate(t, env.Client, builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("1")))
	metricsPort := harness.FreePort(t)
	startNodeguard(t, env.Kubeconfig, f.emulator, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--metrics-secure=false")
	waitForHold(t, target)
	useUpBudget(t, f, leaving)
	ccm := &cloudNodeController{emulator: f.emulator, pool: f.pool}
	ccm.run(t)

	ca := newClusterAutoscaler(f, time.Second, 15*time.Second)
	ca.scaleDown(t, target)
	w := ca.waits[target]
	denied := scrapeCounter(t, metricsPort, `nodeguard_scale_down_claims_total{result="denied"}`)
	t.Logf("denied scale-down: cluster-autoscaler held %s (%d polls of its delay-deletion wait, timeout %s), %v claims denied by nodeguard, then deleted the VM anyway",
		w.took.Round(100*time.Millisecond), w.polls, ca.delayTimeout, denied)
	if !w.timedOut {
		t.Errorf("the hold was released although the budget allowed nothing")
	}
	if denied < 1 {
		t.Errorf("no denied claim counted")
	}
	for _, d := range ca.notDown {
		t.Errorf("VM deleted before its entries were Down: %s", d)
	}
	harness.WaitForEvent(t, env.Client, target, "ScaleDownDenied")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, target)
	}, "%s is gone (the cloud node controller's delete of a node whose VM is gone)", target)
}

// TestClusterAutoscalerRefusedScaleDownKeepsItsPods: the budget
// (maxUnavailable 1) is used up by another node leaving, and
// cluster-autoscaler scales down a node that runs a pod. Its evictions are
// refused (429) while nodeguard cannot charge the scale-down, the drain fails
// at --max-pod-eviction-time (shortened here), and cluster-autoscaler keeps
// the node: its pod still runs and its VM stays. Without the refusal the
// node was drained all the same and only its VM deletion was delayed.
func TestClusterAutoscalerRefusedScaleDownKeepsItsPods(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	f := newFleet(t, "carefused", 3)
	target, leaving := f.nodes[0], f.nodes[1]
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.pool}})
	harness.MustCreate(t, env.Client, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.pool, Name: "app"},
		Spec:       corev1.PodSpec{NodeName: target, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
	})
	harness.MustCreate(t, env.Client, builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("1")))
	metricsPort := harness.FreePort(t)
	startNodeguard(t, env.Kubeconfig, f.emulator, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--metrics-secure=false")
	waitForHold(t, target)
	useUpBudget(t, f, leaving)

	ca := newClusterAutoscaler(f, time.Second, 15*time.Second)
	ca.maxPodEvictionTime = 15 * time.Second
	ca.scaleDown(t, target)
	if !ca.abandoned[target] {
		t.Fatalf("cluster-autoscaler's drain of %s succeeded under a budget that allows nothing", target)
	}
	var pod corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.pool, Name: "app"}, &pod); err != nil || pod.DeletionTimestamp != nil {
		t.Errorf("the refused scale-down's pod: %v, deleting %v; want it running on", err, pod.DeletionTimestamp)
	}
	if _, deleted := ca.vmDeleted[target]; deleted {
		t.Errorf("the VM of %s was deleted", target)
	}
	if refused := scrapeCounter(t, metricsPort, `nodeguard_eviction_admission_requests_total{reason="scale_down_unclaimed",result="denied"}`); refused < 1 {
		t.Errorf("no eviction counted refused as scale_down_unclaimed")
	}
	harness.WaitForEvent(t, env.Client, target, "ScaleDownDenied")
}

// TestClusterAutoscalerCancelledScaleDown: cluster-autoscaler taints a node
// and, before deleting it, removes its taint (a failed drain or a cancelled
// scale-down). nodeguard gives the budget's claim back and puts its standing
// hold back; the node carries nothing else.
func TestClusterAutoscalerCancelledScaleDown(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	f := newFleet(t, "cacancel", 2)
	target := f.nodes[0]
	harness.MustCreate(t, env.Client, builder.NDB(f.pool, builder.NDBSelecting("pool", f.pool), builder.NDBMaxUnavailable("1")))
	startNodeguard(t, env.Kubeconfig, f.emulator)
	waitForHold(t, target)

	patchTaints(t, target, func(ts []corev1.Taint) []corev1.Taint {
		return append(ts, corev1.Taint{Key: ngv1alpha1.ClusterAutoscalerTaintKey, Value: strconv.FormatInt(time.Now().Unix(), 10), Effect: corev1.TaintEffectNoSchedule})
	})
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &n)
		_, held := n.Annotations[ngv1alpha1.DelayDeletionAnnotation]
		_, claimed := n.Annotations[ngv1alpha1.ScaleDownClaimedAnnotation]
		return err == nil && claimed && !held, err
	}, "%s's scale-down is claimed and its hold released", target)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: f.pool}, &ndb)
		return err == nil && ndb.Status.DisruptionsAllowed == 0 && ndb.Status.CurrentAvailable == 1, err
	}, "the budget counts the scaled-down node")

	patchTaints(t, target, func(ts []corev1.Taint) []corev1.Taint {
		return slices.DeleteFunc(ts, func(x corev1.Taint) bool { return x.Key == ngv1alpha1.ClusterAutoscalerTaintKey })
	})
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: target}, &n); err != nil {
			return false, err
		}
		return len(leftovers(&n)) == 0, nil
	}, "%s carries only the standing hold again", target)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: f.pool}, &ndb)
		return err == nil && ndb.Status.DisruptionsAllowed == 1 && len(ndb.Status.DisruptedNodes) == 0, err
	}, "the budget allows one disruption again")
	harness.WaitForEvent(t, env.Client, target, "ScaleDownCancelled")
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return f.allStates(target, "None"), nil
	}, "%s's entries are back to None", target)
}
