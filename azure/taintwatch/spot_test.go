package taintwatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

// preemptEvent is a core/v1 PreemptScheduled event about a node, as the AKS
// spot eviction notice is recorded.
func preemptEvent(name string, node *corev1.Node, uid types.UID) *corev1.Event {
	now := metav1.Now()
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: uid},
		Reason:         PreemptScheduledReason,
		Message:        "Spot VM is scheduled for eviction",
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "aks-node-termination-handler"},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
}

func createEvent(t *testing.T, e *corev1.Event) {
	t.Helper()
	if err := env.Client.Create(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
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

func waitChecks(t *testing.T, result string, after float64) {
	t.Helper()
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return testutil.ToFloat64(spotChecks.WithLabelValues(result)) > after, nil
	}, "a spot-eviction check with result %s", result)
}

// Two PreemptScheduled events, with a restart of nodeguard between them, add
// the taint once. Azure is not configured: the tainter runs anyway.
func TestPreemptScheduledTaintsOnceAcrossRestart(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	node := createNode(t, vmssNode("spot-once", 0))
	added := testutil.ToFloat64(spotTaintsAdded)
	stop := startNodeguard(t, nil, nodeguardOptions{spotEvents: true})

	createEvent(t, preemptEvent("spot-once.1", node, node.UID))
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return hasSpotTaint(getNode(t, node.Name)), nil
	}, "node %s has the spot-eviction taint", node.Name)

	// A second event while running is a duplicate.
	dup := testutil.ToFloat64(spotChecks.WithLabelValues(resultAlreadyTainted))
	createEvent(t, preemptEvent("spot-once.2", node, node.UID))
	waitChecks(t, resultAlreadyTainted, dup)

	// A restart sees both events again, and the taint. The stop writes out the
	// events the first instance recorded, so its event is there at once.
	stop()
	if got, err := nodeEvents(t, node); err != nil || got[ReasonSpotEvictionTaintAdded] != 1 {
		t.Fatalf("after the first nodeguard stopped, %s events = %v (%v), want 1", ReasonSpotEvictionTaintAdded, got[ReasonSpotEvictionTaintAdded], err)
	}
	dup = testutil.ToFloat64(spotChecks.WithLabelValues(resultAlreadyTainted))
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

func TestPreemptScheduledEvents(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	startNodeguard(t, nil, nodeguardOptions{spotEvents: true})
	tests := []struct {
		name string
		// create writes the event(s) for node.
		create    func(t *testing.T, node *corev1.Node)
		wantTaint bool
	}{{
		name: "events.k8s.io/v1 event",
		create: func(t *testing.T, node *corev1.Node) {
			e := &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: node.Name + ".v1"},
				EventTime:  metav1.NowMicro(), ReportingController: "example.com/spot", ReportingInstance: "i",
				Action: "Preempt", Reason: PreemptScheduledReason, Type: corev1.EventTypeWarning, Note: "preempt",
				Regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
			}
			if err := env.Client.Create(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), e) })
		},
		wantTaint: true,
	}, {
		name:      "event without UID, newer than the node",
		create:    func(t *testing.T, node *corev1.Node) { createEvent(t, preemptEvent(node.Name+".nouid", node, "")) },
		wantTaint: true,
	}, {
		name: "event about an earlier node of the same name",
		create: func(t *testing.T, node *corev1.Node) {
			createEvent(t, preemptEvent(node.Name+".old", node, "0a0a0a0a-dead-beef-0000-000000000000"))
		},
		wantTaint: false,
	}, {
		name: "another reason",
		create: func(t *testing.T, node *corev1.Node) {
			e := preemptEvent(node.Name+".other", node, node.UID)
			e.Reason = "Rebooted"
			createEvent(t, e)
			// Only PreemptScheduled events reach the tainter; make it look at
			// the node with one that does not apply, to know it ran.
			createEvent(t, preemptEvent(node.Name+".old", node, "0a0a0a0a-dead-beef-0000-000000000000"))
		},
		wantTaint: false,
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(spotChecks.WithLabelValues(resultNoEvent))
			node := createNode(t, vmssNode(fmt.Sprintf("spot-case-%d", i), i))
			// The tainter looks at a node when it arrives: then at the events.
			waitChecks(t, resultNoEvent, before)
			noEvent := testutil.ToFloat64(spotChecks.WithLabelValues(resultNoEvent))
			tt.create(t, node)
			if tt.wantTaint {
				harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
					return hasSpotTaint(getNode(t, node.Name)), nil
				}, "node %s has the spot-eviction taint", node.Name)
				n := getNode(t, node.Name)
				if _, err := time.Parse(time.RFC3339, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation]); err != nil {
					t.Errorf("%s = %q: %v", ngv1alpha1.SpotEventHandledAnnotation, n.Annotations[ngv1alpha1.SpotEventHandledAnnotation], err)
				}
				return
			}
			waitChecks(t, resultNoEvent, noEvent)
			if n := getNode(t, node.Name); spotTaints(n) != 0 {
				t.Errorf("node %s was tainted: %v", node.Name, n.Spec.Taints)
			}
		})
	}
}
