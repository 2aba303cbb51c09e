package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// startWatch lists objects and watches them from the list's resource version,
// calling handle for each (listed ones as watch.Added), until the test ends.
func startWatch(t *testing.T, list client.ObjectList, opts []client.ListOption, handle func(watch.EventType, client.Object)) {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := wc.List(ctx, list, opts...); err != nil {
		cancel()
		t.Fatal(err)
	}
	items, err := metaItems(list)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for _, obj := range items {
		handle(watch.Added, obj)
	}
	w, err := wc.Watch(ctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if obj, ok := ev.Object.(client.Object); ok && (ev.Type == watch.Added || ev.Type == watch.Modified || ev.Type == watch.Deleted) {
				handle(ev.Type, obj)
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
}

func metaItems(list client.ObjectList) ([]client.Object, error) {
	switch l := list.(type) {
	case *corev1.NodeList:
		out := make([]client.Object, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	case *corev1.PodList:
		out := make([]client.Object, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	}
	return nil, fmt.Errorf("no items of %T", list)
}

// conditionLog records every distinct nodeguard.io/Terminating condition a
// node carried: what kubectl describe node showed at some point.
type conditionLog struct {
	node string
	mu   sync.Mutex
	seen []corev1.NodeCondition
}

// watchCondition starts recording the node's Terminating condition.
func watchCondition(t *testing.T, node string) *conditionLog {
	t.Helper()
	l := &conditionLog{node: node}
	startWatch(t, &corev1.NodeList{}, []client.ListOption{client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", node)}},
		func(_ watch.EventType, obj client.Object) {
			for _, c := range obj.(*corev1.Node).Status.Conditions {
				if c.Type != ngv1alpha1.TerminatingCondition {
					continue
				}
				l.mu.Lock()
				if n := len(l.seen); n == 0 || l.seen[n-1].Reason != c.Reason || l.seen[n-1].Message != c.Message {
					l.seen = append(l.seen, c)
				}
				l.mu.Unlock()
			}
		})
	return l
}

// requireWaiting fails the test unless the node carried the condition, True,
// with the reason and a message containing every part.
func (l *conditionLog) requireWaiting(t *testing.T, reason string, parts ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.seen {
		if c.Status != corev1.ConditionTrue || c.Reason != reason {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(c.Message, p)
		}
		if all {
			return
		}
	}
	var got []string
	for _, c := range l.seen {
		got = append(got, c.Reason+": "+c.Message)
	}
	t.Errorf("node %s never carried %s with reason %s and a message naming %q; it carried %q",
		l.node, ngv1alpha1.TerminatingCondition, reason, parts, got)
}

// tierLog checks, from a watch of the pods on a node, that no pod starts going
// (deletion timestamp set, or deleted outright) while a pod of an earlier tier
// is still on the node, terminating or not.
type tierLog struct {
	mu         sync.Mutex
	present    map[string]int  // pod name -> tier, pods on the node
	going      map[string]bool // pods seen going
	started    map[int]int     // tier -> pods seen going
	violations []string
}

// watchTiers starts checking the tier order on the node; tierOf names the
// tier of a pod (0 first).
func watchTiers(t *testing.T, ns, node string, tierOf func(*corev1.Pod) int) *tierLog {
	t.Helper()
	l := &tierLog{present: map[string]int{}, going: map[string]bool{}, started: map[int]int{}}
	startWatch(t, &corev1.PodList{}, []client.ListOption{client.InNamespace(ns), client.MatchingFields{"spec.nodeName": node}},
		func(typ watch.EventType, obj client.Object) {
			pod := obj.(*corev1.Pod)
			if pod.Annotations["kubernetes.io/config.mirror"] != "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				return
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			tier := tierOf(pod)
			if (pod.DeletionTimestamp != nil || typ == watch.Deleted) && !l.going[pod.Name] {
				l.going[pod.Name] = true
				l.started[tier]++
				for other, otherTier := range l.present {
					if otherTier < tier && other != pod.Name {
						l.violations = append(l.violations, fmt.Sprintf("%s (tier %d) started going while %s (tier %d) was on the node", pod.Name, tier, other, otherTier))
					}
				}
			}
			if typ == watch.Deleted {
				delete(l.present, pod.Name)
			} else {
				l.present[pod.Name] = tier
			}
		})
	return l
}

// check fails the test on a pod that went before its tier's turn, or when a
// tier up to last saw no pod go at all (the check would prove nothing).
func (l *tierLog) check(t *testing.T, last int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for tier := 0; tier <= last; tier++ {
		if l.started[tier] == 0 {
			t.Errorf("no pod of tier %d was seen going", tier)
		}
	}
	if len(l.violations) > 0 {
		t.Errorf("evictions out of tier order (%d), first: %s", len(l.violations), l.violations[0])
	}
}
