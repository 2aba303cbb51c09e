package install

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure/taintwatch"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

// permission is one verb on one resource, as RBAC grants it and as the audit
// log records a request.
type permission struct{ group, resource, verb, namespace string }

func (p permission) String() string {
	s := p.verb + " " + p.resource
	if p.group != "" {
		s += "." + p.group
	}
	if p.namespace != "" {
		s += " in " + p.namespace
	}
	return s
}

// grantedPermissions expands the rules that the rendered install binds to
// nodeguard's ServiceAccount into single verbs: a ClusterRole's through a
// ClusterRoleBinding cluster-wide (no namespace), a Role's through a
// RoleBinding in that namespace.
func grantedPermissions(t *testing.T, rendered string) []permission {
	t.Helper()
	rules := map[string][]rbacv1.PolicyRule{} // "Kind namespace/name"
	var bindings []rbacv1.RoleBinding         // a ClusterRoleBinding reads the same, without namespace
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var obj struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		switch obj.Kind {
		case "ClusterRole", "Role":
			var role rbacv1.Role // a ClusterRole's rules read the same
			if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
				t.Fatal(err)
			}
			rules[obj.Kind+" "+role.Namespace+"/"+role.Name] = role.Rules
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
				t.Fatal(err)
			}
			bindings = append(bindings, b)
		}
	}
	var perms []permission
	for _, b := range bindings {
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return "system:serviceaccount:"+s.Namespace+":"+s.Name == serviceAccount
		}) {
			continue
		}
		ns := b.Namespace // a RoleBinding grants in its namespace, even a ClusterRole's rules
		roleNS := b.Namespace
		if b.RoleRef.Kind == "ClusterRole" {
			roleNS = ""
		}
		role, ok := rules[b.RoleRef.Kind+" "+roleNS+"/"+b.RoleRef.Name]
		if !ok {
			t.Errorf("%s binds %s %s, which the install does not ship", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		for _, r := range role {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						if g == "*" || res == "*" || v == "*" {
							t.Errorf("%s %s grants a wildcard: %+v", b.RoleRef.Kind, b.RoleRef.Name, r)
						}
						perms = append(perms, permission{g, res, v, ns})
					}
				}
			}
		}
	}
	return perms
}

// auditEvent is the part of a kube-apiserver audit event this test reads.
type auditEvent struct {
	Verb             string `json:"verb"`
	RequestURI       string `json:"requestURI"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// requestsOf reads the audit log: the permissions the user's requests used
// (answered with anything but 403) and the requests refused with 403.
func requestsOf(t *testing.T, user string) (used map[permission]bool, forbidden []string) {
	t.Helper()
	f, err := os.Open(env.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	used = map[permission]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log: %v", err)
		}
		if e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user || e.ObjectRef == nil || e.ResponseStatus == nil {
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		p := permission{e.ObjectRef.APIGroup, res, e.Verb, e.ObjectRef.Namespace}
		if e.ResponseStatus.Code == http.StatusForbidden {
			forbidden = append(forbidden, p.String()+" ("+e.RequestURI+")")
			continue
		}
		used[p] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return used, forbidden
}

// usedAnywhere tells whether a cluster-wide grant was used in any namespace
// (or cluster-scoped); a namespaced grant must be used in its namespace.
func usedAnywhere(used map[permission]bool, p permission) bool {
	for u := range used {
		if u.group == p.group && u.resource == p.resource && u.verb == p.verb && (p.namespace == "" || u.namespace == p.namespace) {
			return true
		}
	}
	return false
}

// knownUnused are granted verbs this scenario does not use, each with the
// reason. The test fails for any other unused grant, and for any listed one
// that becomes used.
var knownUnused = func() map[permission]string {
	const watchList = "informers stream their initial list with a watch (WatchList), which the API server authorizes as watch; kept for API servers and clients without WatchList, which LIST first"
	m := map[permission]string{
		{"", "events", "patch", namespace}: "client-go's leader-election recorder (core/v1 events) patches an event only when it repeats within its aggregation window",
	}
	for _, p := range []permission{
		{"", "events", "list", ""}, {"coordination.k8s.io", "leases", "list", namespace},
		{"", "nodes", "list", ""}, {"policy", "poddisruptionbudgets", "list", ""},
		{"storage.k8s.io", "volumeattachments", "list", ""}, {"", "services", "list", ""},
	} {
		m[p] = watchList
	}
	return m
}()

// leastPrivilegeRuns numbers the runs of TestLeastPrivilege in this process.
var leastPrivilegeRuns int

// TestLeastPrivilege runs nodeguard as its ServiceAccount, with exactly the
// roles the install binds to it (manifests/default with the component
// blocked-pdb-replace: the generated ClusterRole, the generated Role in
// kube-node-maintenance, the leader-election Role and the Deployment restart
// grant), through a scenario that
// uses every feature: the guard (finalizer on create, backfill, a delete
// admitted within a NodeDisruptionBudget and one denied), the drain (evictions
// under a PDB, a do-not-evict pod deleted past its deadline, the maintenance
// Lease, a Deployment restarted under a PDB blocked by design), someone else's
// eviction (the pod read from the API server), the taint watcher (admin state Down and back to None, the
// spot-eviction taint from a PreemptScheduled event), budget status, leader
// election and the secure metrics endpoint. Then, from the API server's audit
// log: no request of nodeguard was forbidden, every verb the roles grant
// was used, and no Lease is granted cluster-wide. So removing any one rule
// makes a request of this scenario fail, and this test fails with it.
func TestLeastPrivilege(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t)
	ctx := context.Background()
	// Names of this run: -count=N runs the scenario N times on one cluster.
	leastPrivilegeRuns++
	run := fmt.Sprintf("rbac%d", leastPrivilegeRuns)
	ns, pool := run, run
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	names := []string{run + "-target", run + "-other", run + "-signal", run + "-spare"}
	var emuNodes []armemulator.Node
	for i, name := range names {
		ip := fmt.Sprintf("10.77.0.%d", i+4)
		id := fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s-vmss/virtualMachines/%d", subscription, resourceGroup, run, i)
		emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{ip}, ProviderID: id})
		labels := []string{"pool", pool}
		if i == 3 { // the spot node of the PreemptScheduled notice below
			labels = append(labels, ngv1alpha1.SpotPriorityLabel, ngv1alpha1.SpotPriorityValue)
		}
		harness.MustCreate(t, env.Client, builder.Node(name, builder.WithLabels(labels...), builder.WithProviderID(id), builder.WithInternalIP(ip)))
	}
	const secret = "nodeguard-install-test-client-secret-0c4f"
	az := newAzure(t, armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{}), secret, false)
	target := names[0]
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "web", 2, builder.OnNodes(corev1.LabelHostname, target)))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "web", builder.MaxUnavailable("1")))
	harness.MustCreate(t, env.Client, barePod(ns, "keep", target, map[string]string{ngv1alpha1.DoNotEvictAnnotation: "true"}))
	waitRunning(t, ns, "keep")
	// Replacement first: the only replica of a Deployment under minAvailable:
	// 1, on the target; it may also run on names[1], cordoned until the pod is
	// placed, where its replacement goes.
	setUnschedulable(t, names[1], true)
	harness.MustCreate(t, env.Client, builder.Deployment(ns, "solo", 1, onNodes(target, names[1])))
	harness.MustCreate(t, env.Client, builder.PDB(ns, "solo", builder.MinAvailable("1")))
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "solo"})
		return err == nil && len(pods.Items) == 1 && pods.Items[0].Spec.NodeName == target && pods.Items[0].Status.Phase == corev1.PodRunning, err
	}, "the solo pod runs on %s", target)
	setUnschedulable(t, names[1], false)

	metricsPort := harness.FreePort(t)
	ng := startNodeguard(t, az, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort),
		"--blocked-pdb-policy=replace", "--blocked-pdb-settle=1s", "--azure-admin-state-gone-node-grace=1s",
		// A restored entry leaves its record (and the record's Lease goes)
		// once the hold ends: within the scenario.
		"--azure-admin-state-restore-hold=1s")

	// Guard: the backfill puts the finalizer on existing nodes, the webhook on
	// new ones.
	for _, n := range names {
		harness.WaitForTerminationFinalizer(t, env.Client, n)
	}
	harness.MustCreate(t, env.Client, builder.Node(run+"-new", builder.WithLabels("pool", run+"-new")))
	var created corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: run + "-new"}, &created); err != nil || !slices.Contains(created.Finalizers, ngv1alpha1.TerminationFinalizer) {
		t.Errorf("the webhook did not put the finalizer on a new node: %v %v", created.Finalizers, err)
	}
	// The budget webhook (failurePolicy Fail) admits budgets once nodeguard serves.
	harness.MustCreate(t, env.Client, builder.NDB(run, builder.NDBSelecting("pool", pool), builder.NDBMaxUnavailable("1")))
	// Budget status.
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var ndb ngv1alpha1.NodeDisruptionBudget
		err := env.Client.Get(ctx, client.ObjectKey{Name: run}, &ndb)
		return err == nil && ndb.Status.ExpectedNodes == int32(len(names)) && ndb.Status.DisruptionsAllowed == 1, err
	}, "the NodeDisruptionBudget's status counts %d nodes and allows 1 disruption", len(names))

	// The drain: admitted within the budget; a do-not-evict pod is deleted
	// past the node's drain deadline.
	if err := env.Client.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: target}},
		client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+ngv1alpha1.DrainTimeoutAnnotation+`":"10s"}}}`))); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: target}}); err != nil {
		t.Fatalf("deleting %s within its budget: %v", target, err)
	}
	// The budget is spent: a second delete is denied, and so is its retry. The
	// retry's event repeats the first, so the recorder counts it in the first
	// one's series (a PATCH of events.k8s.io events), even when the node was
	// written in between (the scale-down hold annotates it as the budget is
	// spent). A delete can count twice: when the node changed since the API
	// server read it, the API server runs admission again on the current node
	// within the same request.
	for range 2 {
		err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[1]}})
		if !apierrors.IsTooManyRequests(err) {
			t.Errorf("deleting a second node under maxUnavailable 1: got %v, want a 429 denial", err)
		}
	}
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		err := env.Client.List(ctx, &list)
		denials := slices.DeleteFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name != names[1] || e.Reason != ngwebhook.ReasonDeletionDenied
		})
		return len(denials) == 1 && denials[0].Series != nil && denials[0].Series.Count >= 2, err
	}, "node %s has one %s event counting the 2 (or more) denials", names[1], ngwebhook.ReasonDeletionDenied)

	// A Karpenter node's delete reads its NodeClaim: only a NodeClaim being
	// deleted waives the budgets (a dry run charges nothing and keeps the node).
	karpenterNodeDryRunDelete(t, run+"-karpenter")

	// Someone else's drain: the eviction webhook reads a pod its cache does
	// not have from the API server (here one that does not exist, which it
	// admits: the Eviction API then answers 404).
	ghost := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "never-created"}}
	if err := env.Client.SubResource("eviction").Create(ctx, ghost, &policyv1.Eviction{}); !apierrors.IsNotFound(err) {
		t.Errorf("evicting a pod that does not exist: got %v, want the Eviction API's 404", err)
	}

	// The taint watcher: a signal taint cuts traffic, its removal restores it.
	signalled := names[2]
	setTaints(t, signalled, corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	waitAdminState(t, az.emu, signalled, "Down")
	setTaints(t, signalled)
	waitAdminState(t, az.emu, signalled, "None")
	// The spot-eviction taint from a PreemptScheduled event, of a spot node,
	// written as AKS's node-problem-detector writes it.
	spot := names[3]
	harness.MustCreate(t, env.Client, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: taintwatch.DefaultSpotEventNamespace, Name: "preempt-" + spot},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: spot, APIVersion: "v1"},
		Reason:         taintwatch.PreemptScheduledReason, Message: "Preempt scheduled", Type: corev1.EventTypeWarning,
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
		Source:              corev1.EventSource{Component: taintwatch.DefaultSpotEventComponent, Host: spot},
		ReportingController: taintwatch.DefaultSpotEventComponent, ReportingInstance: spot,
	})
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		err := env.Client.Get(ctx, client.ObjectKey{Name: spot}, &n)
		return err == nil && slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == ngv1alpha1.SpotEvictionTaintKey }), err
	}, "the PreemptScheduled event became the spot-eviction taint on %s", spot)

	harness.Eventually(t, 90*time.Second, func(ctx context.Context) (bool, error) {
		return harness.NodeGone(ctx, env.Client, target)
	}, "the deleted node is drained and released")
	var solo appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "solo"}, &solo); err != nil || solo.Spec.Template.Annotations[ngv1alpha1.RestartedAtAnnotation] == "" {
		t.Errorf("the Deployment under a PDB blocked by design was not restarted (%v): template annotations %v", err, solo.Spec.Template.Annotations)
	}
	// Its entries were set Down for the drain; once it is gone for the grace
	// period they are None again. With the spot node back, no entry is
	// recorded Down any more and the pool's record goes.
	waitAdminState(t, az.emu, target, "None")
	waitAdminState(t, az.emu, spot, "Down")
	setTaints(t, spot)
	waitAdminState(t, az.emu, spot, "None")
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var records coordinationv1.LeaseList
		err := env.Client.List(ctx, &records, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace),
			client.MatchingLabels{"nodeguard.io/record": "load-balancer-admin-state"})
		return err == nil && len(records.Items) == 0, err
	}, "the records go once their restored entries' hold (1s here) is over")

	// Secure metrics: a caller allowed to GET /metrics is served, another is not.
	token := metricsToken(t, true)
	if code, body := scrape(t, metricsPort, token); code != http.StatusOK || !strings.Contains(body, "nodeguard_evictions_total") {
		t.Errorf("scraping with a token bound to nodeguard-metrics-reader: %d, want 200 with nodeguard metrics", code)
	}
	unauthorized := metricsToken(t, false)
	if code, _ := scrape(t, metricsPort, unauthorized); code != http.StatusForbidden {
		t.Errorf("scraping with a token lacking nodeguard-metrics-reader: %d, want 403", code)
	}
	if code, _ := scrape(t, metricsPort, ""); code != http.StatusUnauthorized {
		t.Errorf("scraping without a token: %d, want 401", code)
	}

	// No credential in the logs or in events.
	ng.Kill()
	az.requireTokensUsed(t)
	requireNoCredentials(t, ng.Log(), az.credentials(map[string]string{"a scraper's token": token, "another scraper's token": unauthorized}))

	// The audit log: nothing forbidden, every grant used.
	granted := grantedPermissions(t, installYAML)
	for _, p := range granted {
		if p.group == "coordination.k8s.io" && p.namespace == "" {
			t.Errorf("%s is granted cluster-wide: nodeguard's Leases are in %s and %s only", p, ngv1alpha1.MaintenanceLeaseNamespace, namespace)
		}
	}
	used, forbidden := requestsOf(t, serviceAccount)
	slices.Sort(forbidden)
	forbidden = slices.Compact(forbidden)
	for _, f := range forbidden {
		t.Errorf("nodeguard was forbidden: %s", f)
	}
	var unused []string
	for _, p := range granted {
		if usedAnywhere(used, p) {
			if why, ok := knownUnused[p]; ok {
				t.Errorf("%s is listed as unused (%s) but was used: drop it from knownUnused", p, why)
			}
			continue
		}
		if _, ok := knownUnused[p]; !ok {
			unused = append(unused, p.String())
		}
	}
	sort.Strings(unused)
	for _, u := range unused {
		t.Errorf("granted but never used in the scenario (remove the rule, or exercise it): %s", u)
	}
	t.Logf("%d granted verbs, %d distinct requests of nodeguard audited, %d forbidden", len(granted), len(used), len(forbidden))
}

// karpenterNodeDryRunDelete creates a node registered by Karpenter (its
// finalizer, owned by a NodeClaim that is not being deleted) and deletes it
// with dry run: the webhook reads the NodeClaim, treats the node like any
// other, and admits the dry run (no budget selects it).
func karpenterNodeDryRunDelete(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	harness.InstallKarpenterCRDs(t, env.Client)
	claim := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"nodeClassRef": map[string]any{"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
			"requirements": []any{},
		},
	}}
	harness.MustCreate(t, env.Client, claim)
	node := builder.Node(name)
	node.Finalizers = append(node.Finalizers, ngv1alpha1.KarpenterTerminationFinalizer)
	node.OwnerReferences = []metav1.OwnerReference{{APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: name, UID: claim.GetUID()}}
	harness.MustCreate(t, env.Client, node)
	if err := env.Client.Delete(ctx, node, client.DryRunAll); err != nil {
		t.Errorf("dry-run delete of Karpenter node %s, selected by no budget: %v", name, err)
	}
}

// setUnschedulable cordons or uncordons a node.
func setUnschedulable(t *testing.T, node string, unschedulable bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, unschedulable)
	if err := env.Client.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// onNodes lets a Deployment's pods run only on the named nodes.
func onNodes(names ...string) builder.WorkloadOption {
	return func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: names}},
			}}},
		}}
	}
}

func setTaints(t *testing.T, node string, taints ...corev1.Taint) {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Taints = taints
	if err := env.Client.Patch(context.Background(), &n, patch); err != nil {
		t.Fatal(err)
	}
}

// waitAdminState waits until every emulator entry of the node has the state.
func waitAdminState(t *testing.T, emu *armemulator.Server, node, want string) {
	t.Helper()
	got := map[string]string{}
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		clear(got)
		for k, v := range emu.AdminStates() {
			// The outbound-only pool carries no inbound traffic: nodeguard leaves it.
			if strings.HasSuffix(k, "/"+node) && !strings.Contains(k, "/aksOutboundBackendPool/") {
				got[k] = v
			}
		}
		for _, v := range got {
			if v != want {
				return false, nil
			}
		}
		return len(got) > 0, nil
	}, "node %s's load-balancer entries are %s: %v", node, want, got)
}

// metricsToken returns a token of a new ServiceAccount, bound to
// nodeguard-metrics-reader when allowed.
func metricsToken(t *testing.T, allowed bool) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("scraper-denied-%d", leastPrivilegeRuns)
	if allowed {
		name = fmt.Sprintf("scraper-%d", leastPrivilegeRuns)
	}
	harness.MustCreate(t, env.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}})
	if allowed {
		harness.MustCreate(t, env.Client, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "install-test-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodeguard-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: name}},
		})
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for %s: %v", name, err)
	}
	return tr.Status.Token
}

// scrape GETs /metrics over HTTPS (controller-runtime's self-signed
// certificate) with a bearer token, retrying until the server answers.
func scrape(t *testing.T, port int, token string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var code int
	var body string
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
		return code != http.StatusInternalServerError, nil
	}, "the metrics endpoint answers")
	return code, body
}
