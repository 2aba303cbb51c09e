package taintwatch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// preemptEvent is a PreemptScheduled event about a node as AKS writes it:
// node-problem-detector's recorder on the node, in "default".
func preemptEvent(name string, node *corev1.Node, uid types.UID) *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: uid},
		Reason:         PreemptScheduledReason,
		Message:        "Preempt Scheduled: Wed, 26 Feb 2025 10:13:13 GMT. DurationInSeconds: -1.  For more information, see https://aka.ms/aks/scheduledevents.",
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: DefaultSpotEventComponent, Host: node.Name},
		// client-go's recorder copies the source here.
		ReportingController: DefaultSpotEventComponent, ReportingInstance: node.Name,
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
}

func createEvent(t *testing.T, e *corev1.Event) {
	t.Helper()
	createEventAs(t, env.Client, e)
}

func createEventAs(t *testing.T, c client.Client, e *corev1.Event) {
	t.Helper()
	if err := c.Create(context.Background(), e); err != nil {
		t.Fatalf("creating event %s/%s: %v", e.Namespace, e.Name, err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
}

// earlierNodeUID names a node that no longer exists.
const earlierNodeUID = "0a0a0a0a-dead-beef-0000-000000000000"

var probes atomic.Int32

// probe writes a trusted notice about an earlier node of node's name: it
// applies to nothing, but the tainter looks at the node for it, after every
// event its cache received before.
func probe(t *testing.T, node *corev1.Node) {
	t.Helper()
	createEvent(t, preemptEvent(fmt.Sprintf("%s.probe%d", node.Name, probes.Add(1)), node, earlierNodeUID))
}

// createSpotNode creates a Ready spot node (deleted at cleanup); labels are
// more key, value pairs.
func createSpotNode(t *testing.T, n testNode, labels ...string) *corev1.Node {
	t.Helper()
	return createNodeObject(t, builder.Node(n.name, builder.WithProviderID(n.providerID), builder.WithInternalIP(n.v4),
		builder.WithLabels(append([]string{ngv1alpha1.SpotPriorityLabel, ngv1alpha1.SpotPriorityValue}, labels...)...), builder.Ready()))
}

func createNodeObject(t *testing.T, node *corev1.Node) *corev1.Node {
	t.Helper()
	if err := env.Client.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNode(t, node.Name) })
	return node
}

func spotTaints(n *corev1.Node) int {
	c := 0
	for _, t := range n.Spec.Taints {
		if t.Key == spotEviction.Key {
			c++
		}
	}
	return c
}

func checks(result string) float64 { return testutil.ToFloat64(spotChecks.WithLabelValues(result)) }

// allChecks counts the tainter's checks whatever their result.
func allChecks() float64 {
	sum := 0.0
	for _, r := range []string{resultTainted, resultAlreadyTainted, resultNoEvent, resultNotSpot, resultNotSelected, resultNoticeExpired} {
		sum += checks(r)
	}
	return sum
}

func waitChecks(t *testing.T, result string, after float64) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return checks(result) > after, nil
	}, "a spot-eviction check with result %s", result)
}

func waitSpotTaint(t *testing.T, node *corev1.Node) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return hasSpotTaint(getNode(t, node.Name)), nil
	}, "node %s has the spot-eviction taint", node.Name)
}

// Two PreemptScheduled events, with a restart of nodeguard between them, add
// the taint once. Azure is not configured: the tainter runs anyway.
func TestPreemptScheduledTaintsOnceAcrossRestart(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	node := createSpotNode(t, vmssNode("spot-once", 0))
	added := testutil.ToFloat64(spotTaintsAdded)
	stop := startNodeguard(t, nil, nodeguardOptions{spotEvents: true})

	createEvent(t, preemptEvent("spot-once.1", node, node.UID))
	waitSpotTaint(t, node)

	// A second event while running is a duplicate.
	dup := checks(resultAlreadyTainted)
	createEvent(t, preemptEvent("spot-once.2", node, node.UID))
	waitChecks(t, resultAlreadyTainted, dup)

	// A restart sees both events again, and the taint. The stop writes out the
	// events the first instance recorded, so its event is there at once.
	stop()
	if got, err := nodeEvents(t, node); err != nil || got[ReasonSpotEvictionTaintAdded] != 1 {
		t.Fatalf("after the first nodeguard stopped, %s events = %v (%v), want 1", ReasonSpotEvictionTaintAdded, got[ReasonSpotEvictionTaintAdded], err)
	}
	dup = checks(resultAlreadyTainted)
	createEvent(t, preemptEvent("spot-once.3", node, node.UID))
	startNodeguard(t, nil, nodeguardOptions{spotEvents: true})
	waitChecks(t, resultAlreadyTainted, dup)

	if got := testutil.ToFloat64(spotTaintsAdded) - added; got != 1 {
		t.Errorf("spot-eviction taints added = %v, want 1", got)
	}
	n := getNode(t, node.Name)
	if got := spotTaints(n); got != 1 {
		t.Errorf("node has %d spot-eviction taints, want 1: %v", got, n.Spec.Taints)
	}
	if got, err := nodeEvents(t, n); err != nil || got[ReasonSpotEvictionTaintAdded] != 1 {
		t.Errorf("%s events = %v (%v), want 1", ReasonSpotEvictionTaintAdded, got[ReasonSpotEvictionTaintAdded], err)
	}
}

// unmanagedLabel takes a node out of the tests' --node-selector.
const unmanagedLabel = "nodeguard-test/unmanaged"

// Only a notice written where and by whom AKS writes it, about a spot node
// nodeguard manages, becomes the taint.
func TestPreemptScheduledEvents(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	managed, err := labels.Parse(unmanagedLabel + "!=true")
	if err != nil {
		t.Fatal(err)
	}
	startNodeguard(t, nil, nodeguardOptions{spotEvents: true, managed: managed})
	tests := []struct {
		name string
		// node creates the node (default: a spot node).
		node func(t *testing.T, n testNode) *corev1.Node
		// create writes the event(s) for node.
		create func(t *testing.T, node *corev1.Node)
		// want is the result of the check; tainted: the node is tainted.
		want string
	}{{
		name: "events.k8s.io/v1 event from node-problem-detector on the node",
		create: func(t *testing.T, node *corev1.Node) {
			e := &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: node.Name + ".v1"},
				EventTime:  metav1.NowMicro(), ReportingController: DefaultSpotEventComponent, ReportingInstance: node.Name,
				Action: "Preempt", Reason: PreemptScheduledReason, Type: corev1.EventTypeWarning, Note: "preempt",
				Regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
			}
			if err := env.Client.Create(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
		},
		want: resultTainted,
	}, {
		name: "event without UID (older node-problem-detector), newer than the node",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".nouid", node, "")
			e.ReportingController, e.ReportingInstance = "", "" // and an older client-go
			createEvent(t, e)
		},
		want: resultTainted,
	}, {
		name: "event about an earlier node of the same name",
		create: func(t *testing.T, node *corev1.Node) {
			createEvent(t, preemptEvent(node.Name+".old", node, earlierNodeUID))
		},
		want: resultNoEvent,
	}, {
		name: "another reason",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".other", node, node.UID)
			e.Reason = "Rebooted"
			createEvent(t, e)
		},
		want: resultNoEvent,
	}, {
		name: "node-problem-detector could not ask IMDS",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".imds", node, node.UID)
			e.Message = "IMDS query failed, exit code: 28\nConnection timed out after 24 seconds."
			createEvent(t, e)
		},
		want: resultNoEvent,
	}, {
		name: "another writer in default",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".writer", node, node.UID)
			e.Source.Component, e.ReportingController = "aks-node-termination-handler", "aks-node-termination-handler"
			createEvent(t, e)
		},
		want: resultNoEvent,
	}, {
		name: "the writer, but from another node",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".host", node, node.UID)
			e.Source.Host, e.ReportingInstance = "another-node", "another-node"
			createEvent(t, e)
		},
		want: resultNoEvent,
	}, {
		name: "the notice in kube-system",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".ns", node, node.UID)
			// Outside "default", Event validation wants the object's
			// namespace to match, and does not know a Node has none.
			e.Namespace, e.InvolvedObject.Namespace = metav1.NamespaceSystem, metav1.NamespaceSystem
			createEvent(t, e)
		},
		want: resultNoEvent,
	}, {
		name: "the notice about a node that is not a spot node",
		node: func(t *testing.T, n testNode) *corev1.Node { return createNode(t, n) },
		create: func(t *testing.T, node *corev1.Node) {
			createEvent(t, preemptEvent(node.Name+".regular", node, node.UID))
		},
		want: resultNotSpot,
	}, {
		name: "the notice about a spot node outside --node-selector",
		node: func(t *testing.T, n testNode) *corev1.Node { return createSpotNode(t, n, unmanagedLabel, "true") },
		create: func(t *testing.T, node *corev1.Node) {
			createEvent(t, preemptEvent(node.Name+".unmanaged", node, node.UID))
		},
		want: resultNotSelected,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := vmssNode(fmt.Sprintf("spot-case-%d", i), i)
			before := checks(resultNoEvent)
			var node *corev1.Node
			if tt.node != nil {
				node = tt.node(t, n)
			} else {
				node = createSpotNode(t, n)
			}
			// The tainter looks at a node when it arrives: then at the events.
			waitChecks(t, resultNoEvent, before)
			all, result := allChecks(), checks(tt.want)
			tt.create(t, node)
			if tt.want == resultTainted {
				waitSpotTaint(t, node)
				n := getNode(t, node.Name)
				if _, err := time.Parse(time.RFC3339, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation]); err != nil {
					t.Errorf("%s = %q: %v", ngv1alpha1.SpotEventHandledAnnotation, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation], err)
				}
				if ownSpotTaint(n) == nil {
					t.Errorf("the taint nodeguard added is not dated with %s: %v", ngv1alpha1.SpotEventHandledAnnotation, n.Spec.Taints)
				}
				return
			}
			// Some events never reach the tainter: a probe makes it look at the
			// node after them.
			probe(t, node)
			harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
				return allChecks() > all, nil
			}, "a spot-eviction check of %s", node.Name)
			if n := getNode(t, node.Name); spotTaints(n) != 0 {
				t.Fatalf("node %s was tainted: %v", node.Name, n.Spec.Taints)
			}
			waitChecks(t, tt.want, result)
		})
	}
}

// A tenant with the built-in role edit in its own namespace may write a
// PreemptScheduled Event naming any Node there, forged to look like
// node-problem-detector's: it taints nothing. In "default" it may not write
// one at all.
func TestSpotNoticeFromATenantTaintsNothing(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	const ns, sa = "spot-tenant", "app"
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	t.Cleanup(func() { _ = env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}) })
	harness.MustCreate(t, env.Client, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}})
	harness.MustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa + "-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	})
	aggregateEdit(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	tenant, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	startNodeguard(t, nil, nodeguardOptions{spotEvents: true})
	before := checks(resultNoEvent)
	node := createSpotNode(t, vmssNode("spot-tenant", 0))
	waitChecks(t, resultNoEvent, before)
	all, tainted := allChecks(), checks(resultTainted)

	forged := preemptEvent("spot-tenant.forged", node, node.UID)
	if err := tenant.Create(ctx, forged.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant creating the notice in %s: %v, want forbidden", forged.Namespace, err)
	}
	// In its own namespace edit allows it: Event validation wants the
	// object's namespace to match the event's and does not know that a Node
	// has none.
	forged.Namespace, forged.InvolvedObject.Namespace = ns, ns
	createEventAs(t, tenant, forged)

	probe(t, node)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return allChecks() > all, nil
	}, "a spot-eviction check of %s", node.Name)
	if n := getNode(t, node.Name); spotTaints(n) != 0 {
		t.Fatalf("the tenant's event tainted node %s: %v", node.Name, n.Spec.Taints)
	}
	if got := checks(resultTainted); got != tainted {
		t.Errorf("tainted checks went from %v to %v", tainted, got)
	}
}

// aggregateEdit fills the built-in ClusterRole edit as kube-controller-
// manager's aggregation controller does (the harness runs none): the rules of
// every ClusterRole labelled to aggregate to it.
func aggregateEdit(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var edit rbacv1.ClusterRole
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "edit"}, &edit); err != nil {
		t.Fatalf("the API server's RBAC bootstrap creates ClusterRole edit: %v", err)
	}
	if len(edit.Rules) > 0 || edit.AggregationRule == nil {
		return
	}
	var rules []rbacv1.PolicyRule
	for _, sel := range edit.AggregationRule.ClusterRoleSelectors {
		var parts rbacv1.ClusterRoleList
		if err := env.Client.List(ctx, &parts, client.MatchingLabels(sel.MatchLabels)); err != nil {
			t.Fatal(err)
		}
		for _, p := range parts.Items {
			rules = append(rules, p.Rules...)
		}
	}
	edit.Rules = rules
	if err := env.Client.Update(ctx, &edit); err != nil {
		t.Fatal(err)
	}
}

// setHeartbeat posts the node's status as its kubelet does: Ready, at at.
func setHeartbeat(t *testing.T, name string, at time.Time) {
	t.Helper()
	n := getNode(t, name)
	orig := n.DeepCopy()
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(at)
		}
	}
	if err := env.Client.Status().Patch(context.Background(), n, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

// A spot node still Ready, with a kubelet status posted past the notice plus
// the expiry, was not evicted: the taint nodeguard added comes off (Warning
// event, notice_expired), and the same notice is not applied again. A taint
// someone else added stays whatever the heartbeats. A notice seen when the
// node already outlived it adds no taint.
func TestSpotNoticeExpires(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	const expiry = 5 * time.Minute
	clk := clocktesting.NewFakeClock(time.Now())
	startNodeguard(t, nil, nodeguardOptions{spotEvents: true, spotExpiry: expiry, clock: clk})

	// nodeguard's taint.
	before := checks(resultNoEvent)
	node := createSpotNode(t, vmssNode("spot-expire", 0))
	waitChecks(t, resultNoEvent, before)
	already := checks(resultAlreadyTainted)
	createEvent(t, preemptEvent("spot-expire.1", node, node.UID))
	waitSpotTaint(t, node)
	// The taint's own update looks at the node once more: too early.
	waitChecks(t, resultAlreadyTainted, already)
	tainted := getNode(t, node.Name)
	handled := tainted.Annotations[ngv1alpha1.SpotEventHandledAnnotation]

	// Past the expiry, but the kubelet's last status is older: it may be
	// gone with its VM.
	clk.Step(10 * time.Minute)
	all := allChecks()
	probe(t, node)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return allChecks() > all, nil
	}, "a spot-eviction check of %s", node.Name)
	if n := getNode(t, node.Name); !hasSpotTaint(n) {
		t.Fatalf("the taint was removed with no kubelet status after the expiry: %v", n.Status.Conditions)
	}

	// Someone else's taint (with a date of its own, on a node nodeguard once
	// handled a notice of).
	other := builder.Node("spot-expire-other", builder.WithProviderID(vmssNode("spot-expire-other", 1).providerID),
		builder.WithLabels(ngv1alpha1.SpotPriorityLabel, ngv1alpha1.SpotPriorityValue), builder.Ready(),
		builder.WithTaints(corev1.Taint{Key: ngv1alpha1.SpotEvictionTaintKey, Value: ngv1alpha1.SpotEvictionTaintValue,
			Effect: corev1.TaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: clk.Now().Add(-time.Hour)}}))
	other.Annotations[ngv1alpha1.SpotEventHandledAnnotation] = ngv1alpha1.FormatTime(clk.Now().Add(-2 * time.Hour).Truncate(time.Second))
	all = allChecks()
	createNodeObject(t, other)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return allChecks() > all, nil
	}, "a spot-eviction check of %s", other.Name)
	if n := getNode(t, other.Name); spotTaints(n) != 1 {
		t.Fatalf("someone else's spot-eviction taint on %s was removed: %v", other.Name, n.Spec.Taints)
	}

	// The kubelets post status now.
	expired := checks(resultNoticeExpired)
	setHeartbeat(t, node.Name, clk.Now())
	setHeartbeat(t, other.Name, clk.Now())
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return !hasSpotTaint(getNode(t, node.Name)), nil
	}, "the taint nodeguard added to %s is removed", node.Name)
	waitEvent(t, tainted, ReasonSpotEvictionNoticeExpired)
	if got := checks(resultNoticeExpired) - expired; got != 1 {
		t.Errorf("notice_expired checks = %v, want 1", got)
	}
	n := getNode(t, node.Name)
	if n.Annotations[ngv1alpha1.SpotEventHandledAnnotation] != handled {
		t.Errorf("%s = %q after the removal, want %q kept", ngv1alpha1.SpotEventHandledAnnotation, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation], handled)
	}
	// The same notice again is handled: no taint.
	noEvent := checks(resultNoEvent)
	already = checks(resultAlreadyTainted)
	probe(t, node)
	probe(t, other)
	waitChecks(t, resultNoEvent, noEvent)
	waitChecks(t, resultAlreadyTainted, already)
	if n := getNode(t, node.Name); hasSpotTaint(n) {
		t.Errorf("the handled notice tainted %s again: %v", node.Name, n.Spec.Taints)
	}
	if n := getNode(t, other.Name); spotTaints(n) != 1 {
		t.Errorf("someone else's spot-eviction taint on %s was removed: %v", other.Name, n.Spec.Taints)
	}

	// A notice the node outlived before nodeguard saw it (the clock is 10
	// minutes ahead of the API server's).
	late := createSpotNode(t, vmssNode("spot-expire-late", 2))
	setHeartbeat(t, late.Name, clk.Now())
	expired, added := checks(resultNoticeExpired), testutil.ToFloat64(spotTaintsAdded)
	createEvent(t, preemptEvent("spot-expire-late.1", late, late.UID))
	waitChecks(t, resultNoticeExpired, expired)
	waitEvent(t, late, ReasonSpotEvictionNoticeExpired)
	if n := getNode(t, late.Name); hasSpotTaint(n) || n.Annotations[ngv1alpha1.SpotEventHandledAnnotation] == "" {
		t.Errorf("a notice the node outlived: taints %v, %s %q; want no taint, the notice handled",
			n.Spec.Taints, ngv1alpha1.SpotEventHandledAnnotation, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation])
	}
	if got := testutil.ToFloat64(spotTaintsAdded) - added; got != 0 {
		t.Errorf("a notice the node outlived added the taint %v times (and cut its traffic), want never", got)
	}
}
