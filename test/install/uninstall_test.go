package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// processFinalizer keeps the stand-in nodeguard pods until the test has killed
// the nodeguard process they stand for: here a pod being gone means the
// process is gone, as with a real kubelet.
const processFinalizer = "install.nodeguard.io/process"

// baseDeployment returns the kustomize base's Deployment, whose pods (run by
// kwok) stand in for the nodeguard process the test runs.
func baseDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	for _, doc := range strings.Split(baseYAML, "\n---\n") {
		if strings.Contains(doc, "\nkind: Deployment\n") {
			var d appsv1.Deployment
			if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
				t.Fatal(err)
			}
			return &d
		}
	}
	t.Fatal("the base has no Deployment")
	return nil
}

// TestUninstallReleasesEveryNode installs nodeguard (the base's Deployment,
// with the nodeguard process run by the test as its ServiceAccount), puts
// nodes in every state, and runs nodeguard uninstall: the webhook
// configurations go first, a drain in progress is let finish, a drain that
// cannot finish is cut short and reported, nodeguard is stopped, the bindings
// of the policies that refuse the finalizer's removal to the uninstall's
// cluster-admin are deleted, and no node is left with the finalizer, the
// draining taint or a bookkeeping mark. Then kubectl delete node works without
// nodeguard.
func TestUninstallReleasesEveryNode(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t)
	// The install's policies (and the managed-nodes component's), enforced
	// for the admin that runs the uninstall as for everyone.
	installPolicies(t)
	ctx := context.Background()
	const ns = "uninstall"
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	nodes := []string{"un-infra", "un-finishes", "un-stuck", "un-idle", "un-marked"}
	for _, n := range nodes {
		harness.MustCreate(t, env.Client, builder.Node(n, builder.WithLabels("pool", "uninstall")))
	}
	d := baseDeployment(t)
	d.Spec.Template.Finalizers = []string{processFinalizer}
	d.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "un-infra"}
	d.Spec.Template.Spec.TopologySpreadConstraints = nil
	d.Spec.Template.Spec.PriorityClassName = ""
	harness.MustCreate(t, env.Client, d)
	az := newAzure(t, armemulator.Seed{Subscription: subscription, ResourceGroup: resourceGroup}, "uninstall-test-client-secret", false)
	ng := startNodeguard(t, az)
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(d), d)
		return err == nil && d.Status.ReadyReplicas == 2, err
	}, "nodeguard's Deployment is ready")
	for _, n := range nodes {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	// Two drains in progress, each held by a do-not-evict pod: one is let go
	// during the uninstall, the other never.
	for _, n := range []string{"un-finishes", "un-stuck"} {
		harness.MustCreate(t, env.Client, barePod(ns, n, n, map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}))
		waitRunning(t, ns, n)
		harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", n, "--wait=false")
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: "un-stuck"}, &n)
		return err == nil && slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.DrainingTaintKey }), err
	}, "nodeguard drains un-stuck")
	// nodeguard keeps cluster-autoscaler's delay-deletion hold on every managed
	// node; uninstall must take it away.
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: "un-idle"}, &n)
		_, held := n.Annotations[ngv1alpha1.DelayDeletionAnnotation]
		return err == nil && held, err
	}, "nodeguard holds un-idle for cluster-autoscaler")
	// Marks nodeguard may leave on a node that is not being deleted.
	var marked corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "un-marked"}, &marked); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(marked.DeepCopy())
	marked.Spec.Taints = append(marked.Spec.Taints, corev1.Taint{Key: ngv1alpha1.DrainingTaintKey, Value: ngv1alpha1.DrainingTaintValue, Effect: corev1.TaintEffectNoSchedule})
	marked.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation] = "2099-01-01T00:00:00Z" // held: only uninstall removes it
	marked.Annotations[ngv1alpha1.DrainTimeoutAnnotation] = "30m"                      // the user's: stays
	// As nodeguard: the protected fields' policy lets no one else write its marks.
	if err := userClient(t, serviceAccount).Patch(ctx, &marked, patch); err != nil {
		t.Fatal(err)
	}

	// Records of load-balancer entries nodeguard set Down (the format
	// azure.LeaseRecords keeps): one for a node that is gone, one for un-idle.
	var idle corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "un-idle"}, &idle); err != nil {
		t.Fatal(err)
	}
	harness.MustCreate(t, env.Client, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: recordLeaseName("kubernetes/kubernetes"),
		Labels: map[string]string{"nodeguard.io/record": "load-balancer-admin-state"},
		Annotations: map[string]string{
			"nodeguard.io/backend-pool": "kubernetes/kubernetes",
			"nodeguard.io/entries-set-down": `{"un-gone-entry":{"uid":"0b7a2c9e-0000-4000-8000-000000000001","node":"un-gone"},` +
				`"un-idle-entry":{"uid":"` + string(idle.UID) + `","node":"un-idle"}}`,
		},
	}})

	// Someone else's webhook configuration, calling a webhook of a name like
	// nodeguard's: uninstall deletes nodeguard's two configurations by name,
	// never this one.
	foreign := foreignWebhookConfiguration()
	harness.MustCreate(t, env.Client, foreign)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), foreign) })

	// Stand in for the kubelet: once the Deployment is scaled to 0, stop the
	// process, then let its pods go.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = harness.Poll(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
			var cur appsv1.Deployment
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(d), &cur)
			return err == nil && ptr.Deref(cur.Spec.Replicas, 1) == 0, nil
		})
		ng.Kill()
		_ = harness.Poll(ctx, 90*time.Second, func(ctx context.Context) (bool, error) {
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
				return false, nil
			}
			for i := range pods.Items {
				_ = env.Client.Patch(ctx, &pods.Items[i], client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
			}
			return len(pods.Items) == 0, nil
		})
	}()
	// Let the first drain finish once the uninstall waits for the drains in
	// progress (not before: it would be over before the uninstall looked).
	var out syncBuffer
	go func() {
		_ = harness.Poll(ctx, time.Minute, func(context.Context) (bool, error) {
			return strings.Contains(out.String(), "waiting up to"), nil
		})
		_ = env.Client.Delete(ctx, barePod(ns, "un-finishes", "un-finishes", nil))
	}()

	cmd := exec.Command(nodeguardBinary(t), "uninstall", "--kubeconfig="+env.Kubeconfig, "--drain-wait=25s", "--stop-wait=60s")
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	<-stopped
	t.Logf("nodeguard uninstall:\n%s", out.String())
	if err != nil {
		t.Fatalf("nodeguard uninstall: %v", err)
	}
	for _, want := range []string{
		"deleted MutatingWebhookConfiguration nodeguard-mutating-webhook-configuration",
		"deleted ValidatingWebhookConfiguration nodeguard-validating-webhook-configuration",
		"drained and released: un-finishes",
		"scaled Deployment nodeguard-system/nodeguard to 0",
		"deleted ValidatingAdmissionPolicyBinding nodeguard-protected-fields",
		"deleted ValidatingAdmissionPolicyBinding nodeguard-managed-nodes",
		"un-marked: removed finalizer, taint nodeguard.io/draining, annotation nodeguard.io/finalizer-added-at",
		"un-stuck: released WITHOUT a complete drain",
		"WARNING backend pool kubernetes/kubernetes, entry un-gone-entry: nodeguard set it Down for node un-gone, which is gone",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
		t.Errorf("uninstall deleted (or lost) a webhook configuration it did not install, %s: %v", foreign.Name, err)
	}
	if strings.Contains(out.String(), "entry un-idle-entry") {
		t.Error("uninstall warned about the record of a node that exists (step 4 covers those)")
	}
	if strings.Index(out.String(), "deleted ValidatingWebhookConfiguration") > strings.Index(out.String(), "removed finalizer") {
		t.Error("the webhook configurations must go before any finalizer")
	}
	if i := strings.Index(out.String(), "deleted ValidatingAdmissionPolicyBinding"); i < strings.Index(out.String(), "no nodeguard pod is left") || i > strings.Index(out.String(), "removed finalizer") {
		t.Error("the policy bindings must go once nodeguard is stopped (until then they keep others from removing its finalizer mid-drain), and before any finalizer")
	}
	for _, name := range []string{"nodeguard-protected-fields", "nodeguard-managed-nodes"} {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			t.Errorf("uninstall deleted (or lost) the policy %s; only its binding is uninstall's: %v", name, err)
		}
	}

	var list corev1.NodeList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		if slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) {
			t.Errorf("node %s still has the finalizer", n.Name)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == ngv1alpha1.DrainingTaintKey }) {
			t.Errorf("node %s still has the draining taint", n.Name)
		}
		for _, a := range []string{ngv1alpha1.FinalizerAddedAtAnnotation, ngv1alpha1.DelayDeletionAnnotation} {
			if _, ok := n.Annotations[a]; ok {
				t.Errorf("node %s still has %s", n.Name, a)
			}
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "un-marked"}, &marked); err != nil || marked.Annotations[ngv1alpha1.DrainTimeoutAnnotation] != "30m" {
		t.Errorf("uninstall must leave the user's %s annotation: %v %v", ngv1alpha1.DrainTimeoutAnnotation, marked.Annotations, err)
	}
	for _, n := range []string{"un-finishes", "un-stuck"} {
		harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) { return harness.NodeGone(ctx, env.Client, n) }, "%s is gone", n)
	}
	// Without nodeguard, deleting a node just works.
	harness.MustKubectl(t, env.Kubeconfig, "", "delete", "node", "un-idle", "un-marked", "--timeout=30s")
	for _, n := range []string{"un-idle", "un-marked"} {
		if gone, err := harness.NodeGone(ctx, env.Client, n); !gone {
			t.Errorf("node %s is not gone after kubectl delete node: %v", n, err)
		}
	}
	// A second run finds nothing to do.
	again, err := exec.Command(nodeguardBinary(t), "uninstall", "--kubeconfig="+env.Kubeconfig, "--drain-wait=0").CombinedOutput()
	if err != nil || !strings.Contains(string(again), "none found") {
		t.Errorf("a second uninstall: %v\n%s", err, again)
	}
}

// foreignWebhookConfiguration is a configuration of another tool that calls
// a webhook named *.nodeguard.io; it matches no request.
func foreignWebhookConfiguration() *admissionregistrationv1.ValidatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "someone-elses-policies"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "audit.nodeguard.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/audit")},
			AdmissionReviewVersions: []string{"v1"}, SideEffects: &none, FailurePolicy: &ignore,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"install-test": "matches-nothing"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
		}},
	}
}

func nodeguardBinary(t *testing.T) string {
	t.Helper()
	binary, err := harness.NodeguardBinary()
	if err != nil {
		t.Fatal(err)
	}
	return binary
}

// syncBuffer is a bytes.Buffer a process writes while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// recordLeaseName is the name of the Lease nodeguard keeps a backend pool's
// admin-state record in (azure.leaseName): a Lease of another name that
// claims the pool is ignored as forged.
func recordLeaseName(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return "lb-admin-state-" + hex.EncodeToString(sum[:10])
}
