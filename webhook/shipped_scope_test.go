package webhook_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// managedLabel is the label the kustomize component managed-nodes selects.
const managedLabel = "nodeguard.io/managed"

// With nodeguard down, the shipped configuration with the managed-nodes
// component (failurePolicy Fail, objectSelector mirroring --node-selector)
// lets a node nodeguard does not manage be deleted, and refuses deleting a
// managed one with a message naming nodeguard's webhook.
func TestWithNodeguardDownOnlyManagedNodeDeletesAreRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t) // nodeguard is down: nothing answers
	installShippedWebhooks(t, "managed-nodes")
	unmanaged := createReadyNodes(t, uniqueName("outside"), 1)[0]
	managed := createReadyNodes(t, uniqueName("inside"), 1, builder.WithLabels(managedLabel, "true"))[0]
	releaseOnCleanup(t, managed)

	if out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", unmanaged, "--wait=false"); err != nil {
		t.Errorf("with nodeguard down, kubectl delete node %s (unmanaged): %v\n%s", unmanaged, err, out)
	}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: unmanaged}, &corev1.Node{}); !apierrors.IsNotFound(err) {
		t.Errorf("the unmanaged node after its delete: %v, want it gone", err)
	}
	out, err := harness.Kubectl(env.Kubeconfig, "", "delete", "node", managed, "--wait=false")
	if err == nil || !strings.Contains(out, `failed calling webhook "delete.nodeguard.io"`) {
		t.Errorf("with nodeguard down, kubectl delete node %s (managed): %v, want refused naming nodeguard's webhook:\n%s", managed, err, out)
	}
	t.Logf("kubectl delete node %s with nodeguard down: %s", managed, strings.TrimSpace(out))
	wantNotDeleting(t, managed)
}

// With nodeguard down, the shipped NodeClaim webhook with the managed-nodes
// component (failurePolicy Fail, objectSelector mirroring --node-selector on
// the NodeClaim's labels) lets Karpenter delete the NodeClaim of a node
// nodeguard does not manage (spot interruption, expiry, drift), and refuses
// the NodeClaim of a managed one with a message naming nodeguard's webhook.
func TestWithNodeguardDownOnlyManagedNodeClaimDeletesAreRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t) // nodeguard is down: nothing answers
	installNodeClaimCRD(t)
	installShippedWebhooks(t, "managed-nodes")
	unmanaged := createReadyNodes(t, uniqueName("claim-outside"), 1)[0]
	managed := createReadyNodes(t, uniqueName("claim-inside"), 1, builder.WithLabels(managedLabel, "true"))[0]
	releaseOnCleanup(t, managed)
	createNodeClaim(t, unmanaged, unmanaged)
	createNodeClaim(t, managed, managed, managedLabel, "true")

	if out, err := deleteNodeClaim(unmanaged); err != nil {
		t.Errorf("with nodeguard down, deleting the NodeClaim of unmanaged node %s: %v\n%s", unmanaged, err, out)
	}
	out, err := deleteNodeClaim(managed)
	if err == nil || !strings.Contains(out, `failed calling webhook "nodeclaim.nodeguard.io"`) {
		t.Errorf("with nodeguard down, deleting the NodeClaim of managed node %s: %v, want refused naming nodeguard's webhook:\n%s", managed, err, out)
	}
	t.Logf("kubectl delete nodeclaim %s with nodeguard down: %s", managed, strings.TrimSpace(out))
}

// With the shipped managed-nodes scope and a nodeguard managing the same
// nodes, the API server calls nodeguard for managed nodes only: an unmanaged
// node is created and deleted without a single admission request.
func TestShippedScopeCallsNodeguardForManagedNodesOnly(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	managedSelector := labels.SelectorFromSet(labels.Set{managedLabel: "true"})
	useGuards(t) // down while the configuration changes
	installShippedWebhooks(t, "managed-nodes")
	useGuards(t, startManagingGuard(t, managedSelector))

	before := admissionCalls(t)
	unmanaged := createReadyNodes(t, uniqueName("outside-up"), 1)[0]
	if err := deleteNode(unmanaged); err != nil {
		t.Fatalf("deleting an unmanaged node: %v", err)
	}
	if calls := admissionCalls(t); calls != before {
		t.Errorf("creating and deleting an unmanaged node called nodeguard %v times, want 0", calls-before)
	}
	managed := createReadyNodes(t, uniqueName("inside-up"), 1, builder.WithLabels(managedLabel, "true"))[0]
	releaseOnCleanup(t, managed)
	if n := getNode(t, managed); !slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Errorf("managed node %s has finalizers %v, want %s", managed, n.Finalizers, ngv1alpha1.TerminationFinalizer)
	}
	if err := deleteNode(managed); err != nil {
		t.Fatalf("deleting a managed node under no budget: %v", err)
	}
	wantDeleting(t, managed)
	if calls := admissionCalls(t); calls != before+2 {
		t.Errorf("creating and deleting a managed node called nodeguard %v times, want 2 (CREATE, DELETE)", calls-before)
	}
}

// A node already being deleted can be deleted again while nodeguard is down:
// the DELETE webhook is not called for it (matchConditions), as nodeguard
// would allow it anyway.
func TestWithNodeguardDownADeletingNodeCanBeDeletedAgain(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	g := startGuard(t, false)
	useGuards(t, g)
	names := createReadyNodes(t, uniqueName("redelete"), 2)
	releaseOnCleanup(t, names...)
	if err := deleteNode(names[0]); err != nil {
		t.Fatalf("deleting node %s under no budget: %v", names[0], err)
	}
	wantDeleting(t, names[0]) // held by the finalizer: no finalizer controller runs here

	// nodeguard stops: its server closes the connections the API server keeps
	// open through the proxy, and the proxy accepts no new ones.
	g.stop()
	useGuards(t)
	if err := deleteNode(names[1]); err == nil || !strings.Contains(err.Error(), `failed calling webhook "delete.nodeguard.io"`) {
		t.Fatalf("with nodeguard down, deleting node %s: %v, want refused by the DELETE webhook", names[1], err)
	}
	if err := deleteNode(names[0]); err != nil {
		t.Errorf("with nodeguard down, deleting the already deleting node %s again: %v, want accepted", names[0], err)
	}
}

// startManagingGuard starts the webhooks and the budget status controller for
// the nodes of managed (nodeguard's --node-selector).
func startManagingGuard(t *testing.T, managed labels.Selector) *guard {
	t.Helper()
	mgr, addr, answers := newManager(t)
	if err := ngwebhook.Register(mgr, ngwebhook.Options{Managed: managed, DeleteTimeout: ngwebhook.DefaultDeleteTimeout,
		Rules: doorRules(mgr, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	if err := (&budget.StatusReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}, ClaimTimeout: budget.DefaultClaimTimeout}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	return run(t, mgr, addr, answers)
}

// admissionCalls counts every admission request the webhook servers of this
// process answered.
func admissionCalls(t *testing.T) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == "nodeguard_admission_requests_total" {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// installShippedWebhooks makes the installed webhook configurations what
// kubectl kustomize renders for manifests/default with the given components
// (manifests/components/...): every field of each webhook but clientConfig,
// which stays pointed at this test's webhook servers. nodeguard must be down
// (useGuards with none) when it is called. The test's end restores them.
func installShippedWebhooks(t *testing.T, components ...string) {
	t.Helper()
	ctx := context.Background()
	shipped := renderShippedWebhooks(t, components...)
	// A probe node outside any selector the components set tells when the API
	// server applies the change: with nodeguard down, a dry-run delete of it
	// is refused while the webhook covers it.
	probe := createReadyNodes(t, uniqueName("scope-probe"), 1)[0]

	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	if err := env.Client.List(ctx, &validating); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.List(ctx, &mutating); err != nil {
		t.Fatal(err)
	}
	var restore []client.Object
	replaced := 0
	for i := range validating.Items {
		cfg := &validating.Items[i]
		restore = append(restore, cfg.DeepCopy())
		for j := range cfg.Webhooks {
			if w, ok := shipped.validating[cfg.Webhooks[j].Name]; ok {
				w.ClientConfig = cfg.Webhooks[j].ClientConfig
				cfg.Webhooks[j] = w
				replaced++
			}
		}
		if err := env.Client.Update(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for i := range mutating.Items {
		cfg := &mutating.Items[i]
		restore = append(restore, cfg.DeepCopy())
		for j := range cfg.Webhooks {
			if w, ok := shipped.mutating[cfg.Webhooks[j].Name]; ok {
				w.ClientConfig = cfg.Webhooks[j].ClientConfig
				cfg.Webhooks[j] = w
				replaced++
			}
		}
		if err := env.Client.Update(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	if want := len(shipped.validating) + len(shipped.mutating); replaced != want {
		t.Fatalf("replaced %d installed webhooks with the %d shipped ones", replaced, want)
	}
	waitForDeleteWebhookScope(t, probe, false)

	t.Cleanup(func() {
		front.SetBackends() // down again, so that the probe tells
		for _, old := range restore {
			cur := old.DeepCopyObject().(client.Object)
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(old), cur); err != nil {
				t.Error(err)
				return
			}
			switch cur := cur.(type) {
			case *admissionregistrationv1.ValidatingWebhookConfiguration:
				cur.Webhooks = old.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks
			case *admissionregistrationv1.MutatingWebhookConfiguration:
				cur.Webhooks = old.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks
			}
			if err := env.Client.Update(ctx, cur); err != nil {
				t.Error(err)
				return
			}
		}
		// The probe stays: it has no finalizer and a name of this run only.
		waitForDeleteWebhookScope(t, probe, true)
	})
}

type shippedWebhooks struct {
	validating map[string]admissionregistrationv1.ValidatingWebhook
	mutating   map[string]admissionregistrationv1.MutatingWebhook
}

// renderShippedWebhooks runs kubectl kustomize on manifests/default with the
// components and returns its webhooks by name.
func renderShippedWebhooks(t *testing.T, components ...string) shippedWebhooks {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(harness.RepoRoot(), "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := "resources:\n- " + filepath.Join(rel, "default") + "\ncomponents:\n"
	for _, c := range components {
		kustomization += "- " + filepath.Join(rel, "components", c) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize manifests/default with %v: %v", components, err)
	}
	hooks := shippedWebhooks{validating: map[string]admissionregistrationv1.ValidatingWebhook{}, mutating: map[string]admissionregistrationv1.MutatingWebhook{}}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ValidatingWebhookConfiguration":
			var cfg admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
				t.Fatal(err)
			}
			for _, w := range cfg.Webhooks {
				hooks.validating[w.Name] = w
			}
		case "MutatingWebhookConfiguration":
			var cfg admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
				t.Fatal(err)
			}
			for _, w := range cfg.Webhooks {
				hooks.mutating[w.Name] = w
			}
		}
	}
	if len(hooks.validating) == 0 || len(hooks.mutating) == 0 {
		t.Fatalf("kubectl kustomize rendered no webhook configurations:\n%s", out)
	}
	return hooks
}

// waitForDeleteWebhookScope waits until the API server applies a webhook
// configuration change: with nodeguard down, a dry-run delete of probe is
// refused by the DELETE webhook when it covers the node, and goes through when
// not.
func waitForDeleteWebhookScope(t *testing.T, probe string, covered bool) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: probe}}, client.DryRunAll)
		refused := err != nil && strings.Contains(err.Error(), `failed calling webhook "delete.nodeguard.io"`)
		return refused == covered, nil
	}, "the API server applies the new webhook configuration (node %s covered: %v)", probe, covered)
}

// CheckScope finds each of nodeguard's webhooks whose objectSelector does not
// select the nodes of --node-selector, in the configurations as installed, and
// the start-up check reports them with a Warning event and a gauge.
func TestScopeCheckFindsWebhooksThatDoNotMirrorTheNodeSelector(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	all := []string{ngwebhook.DeleteWebhookName, ngwebhook.FinalizerWebhookName, ngwebhook.NodeClaimWebhookName}
	check := func(t *testing.T, nodeSelector string, want []string) {
		t.Helper()
		managed, err := labels.Parse(nodeSelector)
		if err != nil {
			t.Fatal(err)
		}
		mismatches, err := ngwebhook.CheckScope(context.Background(), env.Client, managed)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range mismatches {
			got = append(got, m.Webhook)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("--node-selector=%q: mismatched webhooks %v, want %v (%v)", nodeSelector, got, want, mismatches)
		}
	}
	// manifests/webhook as installed: no objectSelector, every node.
	check(t, "", nil)
	check(t, managedLabel+"=true", all)

	useGuards(t) // down while the configuration changes
	installShippedWebhooks(t, "managed-nodes")
	check(t, managedLabel+"=true", nil)
	check(t, "", all)
	check(t, managedLabel+"=false", all)

	scope := &ngwebhook.ScopeCheck{Reader: env.Client, Managed: labels.Everything(), Recorder: newRecorder(t)}
	if err := scope.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := env.Client.List(context.Background(), &validating); err != nil || len(validating.Items) == 0 {
		t.Fatalf("listing validating webhook configurations: %v, %d", err, len(validating.Items))
	}
	waitForEvent(t, "ValidatingWebhookConfiguration", validating.Items[0].Name, ngwebhook.ReasonWebhookScopeMismatch,
		`webhook delete.nodeguard.io in `+validating.Items[0].Name+` is called for the nodes "`+managedLabel+`=true" while nodeguard manages the nodes (all)`)
	waitForEvent(t, "ValidatingWebhookConfiguration", validating.Items[0].Name, ngwebhook.ReasonWebhookScopeMismatch,
		`webhook nodeclaim.nodeguard.io in `+validating.Items[0].Name+` is called for the NodeClaims "`+managedLabel+`=true" while nodeguard manages the nodes (all)`)
	for _, w := range all {
		if got := gaugeValue(t, "nodeguard_webhook_scope_mismatch", "webhook", w); got != 1 {
			t.Errorf("nodeguard_webhook_scope_mismatch{webhook=%q} = %v, want 1", w, got)
		}
	}
}

// newRecorder records events through the API server until the test ends.
func newRecorder(t *testing.T) events.EventRecorder {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	stop := make(chan struct{})
	broadcaster.StartRecordingToSink(stop)
	t.Cleanup(func() { close(stop); broadcaster.Shutdown() })
	return broadcaster.NewRecorder(env.Scheme, "nodeguard-webhook-test")
}

func gaugeValue(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
