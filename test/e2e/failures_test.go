package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// TestUnreachableARMAndAPodUnderTwoPDBs: with ARM unreachable the drain goes
// on after --admin-state-timeout with a Warning event; a pod under two PDBs is
// reported once and not evicted over and over; once it is gone, the node is
// released.
func TestUnreachableARMAndAPodUnderTwoPDBs(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	top := newTopology(t, "arm", false)
	harness.MustCreate(t, env.Client, builder.Deployment(top.ns, "dual", 1, builder.OnNodes(corev1.LabelHostname, top.target)))
	for _, name := range []string{"dual-a", "dual-b"} {
		pdb := builder.PDB(top.ns, "dual", builder.MaxUnavailable("1"))
		pdb.Name = name
		harness.MustCreate(t, env.Client, pdb)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, top.target)
		for _, p := range pods {
			if p.Labels["app"] == "dual" && harness.PodReady(&p) {
				return true, nil
			}
		}
		return false, err
	}, "the pod under two PDBs runs on the target")
	top.emulator.Close() // ARM unreachable
	proxy := startAPIProxy(t)
	_, counter := startNodeguardCountingPasses(t, proxy.Kubeconfig, top.emulator, "--admin-state-timeout=3s")
	harness.WaitForTerminationFinalizer(t, env.Client, top.target)

	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", top.target, "--wait=false")
	harness.WaitForEvent(t, env.Client, top.target, "TrafficCutTimedOut")
	harness.WaitForEvent(t, env.Client, top.target, "PodUnderMultiplePDBs")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, top.target)
		var apps []string
		for _, p := range pods {
			apps = append(apps, p.Labels["app"])
		}
		slices.Sort(apps)
		return err == nil && slices.Equal(apps, []string{"daemon", "dual"}), err
	}, "everything but the pod under two PDBs (and the DaemonSet pod, last) is drained")
	// Several more drain passes happen while the pod stays (PDB changes, backstop).
	before := len(proxy.Answers(top.ns, "dual"))
	passes := counter.of(top.target)
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		return counter.of(top.target) >= passes+3, nil
	}, "three more drain passes happen")
	if n, _ := harness.CountEvents(ctx, env.Client, top.target, "PodUnderMultiplePDBs"); n != 1 {
		t.Errorf("%d PodUnderMultiplePDBs events, want exactly 1", n)
	}
	if after := len(proxy.Answers(top.ns, "dual")); after > 1 {
		t.Errorf("the pod under two PDBs got %d eviction requests (%d before the last passes), want at most 1: no hot loop", after, before)
	}
	if gone, _ := harness.NodeGone(ctx, env.Client, top.target); gone {
		t.Fatal("the node was released with a pod still on it")
	}

	pods, _ := evictablePodsOn(ctx, top.ns, top.target)
	for i := range pods {
		if pods[i].Labels["app"] == "dual" {
			if err := env.Client.Delete(ctx, &pods[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, top.target)
	}, "the node is released")
}

// killPointTimeout bounds the wait for the drain to reach the next kill point,
// a restart of nodeguard included.
const killPointTimeout = 90 * time.Second

// TestKilledAtEveryPhaseStillReleasesWithinBudgets kills nodeguard (SIGKILL)
// at ten points of a node's termination, from the Lease to the release, and
// restarts it each time: the node is still released, no PDB is violated and no
// finalizer or maintenance hold is left behind.
func TestKilledAtEveryPhaseStillReleasesWithinBudgets(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	top := newTopology(t, "kill", false)
	proxy := startAPIProxy(t)
	monitor := watchBudgets(t, top.ns)
	start := func() *harness.Nodeguard { return startNodeguard(t, proxy.Kubeconfig, top.emulator) }
	ng := start()
	harness.WaitForTerminationFinalizer(t, env.Client, top.target)
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", top.target, "--wait=false")

	var node corev1.Node
	getNode := func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: top.target}, &node)
		return err == nil, client.IgnoreNotFound(err)
	}
	podsLeft := func(ctx context.Context) int {
		pods, _ := evictablePodsOn(ctx, top.ns, top.target)
		return len(pods)
	}
	initial := podsLeft(ctx)
	if last := 14; initial <= last {
		t.Fatalf("%d evictable pods on the target: the last kill point (%d evicted) must leave some", initial, last)
	}
	killPoints := []struct {
		name    string
		reached func(ctx context.Context) bool
	}{
		{"at start-up", func(context.Context) bool { return true }},
		{"maintenance Lease taken", func(ctx context.Context) bool {
			var l coordinationv1.Lease
			return env.Client.Get(ctx, client.ObjectKey{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: top.target}, &l) == nil && l.Spec.HolderIdentity != nil
		}},
		{"cordoned", func(ctx context.Context) bool { ok, _ := getNode(ctx); return ok && node.Spec.Unschedulable }},
		// Azure has every entry Down: the termination's record of the cut
		// may not be written yet, and the next leader confirms it again.
		{"traffic cut", func(context.Context) bool {
			states := top.targetStates()
			return len(states) > 0 && !slices.ContainsFunc(states, func(s string) bool { return !strings.HasSuffix(s, "=Down") })
		}},
	}
	for _, left := range []int{1, 3, 6, 9, 12, 14} {
		killPoints = append(killPoints, struct {
			name    string
			reached func(ctx context.Context) bool
		}{fmt.Sprintf("%d pods evicted", left), func(ctx context.Context) bool { return podsLeft(ctx) <= initial-left }})
	}
	// Every kill point comes before the release (the last leaves pods on the
	// node), so each one is waited for and each kill happens.
	for _, kp := range killPoints {
		began := time.Now()
		if err := harness.Poll(ctx, killPointTimeout, func(ctx context.Context) (bool, error) { return kp.reached(ctx), nil }); err != nil {
			t.Fatalf("kill point %q not reached within %s: %v", kp.name, killPointTimeout, err)
		}
		if ok, _ := getNode(ctx); !ok {
			t.Fatalf("the node was released before kill point %q", kp.name)
		}
		ng.Kill()
		t.Logf("killed nodeguard: %s (after %s)", kp.name, time.Since(began).Round(time.Millisecond))
		ng = start()
	}
	harness.Eventually(t, 2*time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, top.target)
	}, "the node is released after %d kills", len(killPoints))
	monitor.check(t)
	waitLeaseGone(t, top.target)
	// In-flight evictions are not checked here: a request of a killed process
	// may still be on its way when the restarted one sends the next.
}

// TestDrainDeadlineThenVolumeDetach: past --drain-timeout the pods left (here a
// do-not-evict one) are deleted with a Warning event; then the node waits for
// its VolumeAttachments to go before it is released.
func TestDrainDeadlineThenVolumeDetach(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	top := newTopology(t, "deadline", true)
	attachment := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: top.ns + "-disk"},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "disk.csi.azure.com", NodeName: top.target,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("pv-deadline")},
		},
	}
	harness.MustCreate(t, env.Client, attachment)
	startNodeguard(t, env.Kubeconfig, top.emulator, "--drain-timeout=5s", "--volume-detach-timeout=5m")
	harness.WaitForTerminationFinalizer(t, env.Client, top.target)

	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", top.target, "--wait=false")
	harness.WaitForEvent(t, env.Client, top.target, "DrainDeadlineExceeded")
	harness.WaitForEvent(t, env.Client, top.target, "WaitingForVolumeDetach")
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		pods, err := evictablePodsOn(ctx, top.ns, top.target)
		return err == nil && len(pods) == 0, err
	}, "the do-not-evict pod was deleted past the deadline")
	if gone, _ := harness.NodeGone(ctx, env.Client, top.target); gone {
		t.Fatal("the node was released while a VolumeAttachment still referred to it")
	}
	if err := env.Client.Delete(ctx, attachment); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, top.target)
	}, "the node is released once its volume is detached")
}
