package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/harness"
)

// startWatch lists objects and watches them from the list's resource version,
// calling handle for each (listed ones as watch.Added, then synced if not nil)
// in order, until the test ends. When the API server ends the watch (its request timeout), the watch
// resumes from the last resource version seen, which bookmarks keep fresh, so
// handle sees every change. A watch that cannot resume, or that reports an
// error, fails the test: whatever it monitors may have been missed.
func startWatch(t *testing.T, list client.ObjectList, opts []client.ListOption, handle func(watch.EventType, client.Object), synced func()) {
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
	if synced != nil {
		synced()
	}
	rv := list.GetResourceVersion()
	var broken error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			w, err := wc.Watch(ctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})...)
			if err != nil {
				if ctx.Err() == nil {
					broken = fmt.Errorf("resuming the watch of %T from resource version %s: %w", list, rv, err)
				}
				return
			}
			if rv, err = follow(w, rv, handle); err != nil {
				if ctx.Err() == nil { // not the test ending the watch
					broken = err
				}
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if broken != nil {
			t.Errorf("a watch this test relies on broke, so it may have missed changes: %v", broken)
		}
	})
}

// follow hands a watch's events to handle until the watch ends, and returns
// the last resource version seen, or the error the watch reported.
func follow(w watch.Interface, rv string, handle func(watch.EventType, client.Object)) (string, error) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			return rv, fmt.Errorf("watch error: %v", apierrors.FromObject(ev.Object))
		case watch.Bookmark, watch.Added, watch.Modified, watch.Deleted:
			obj, ok := ev.Object.(client.Object)
			if !ok {
				continue
			}
			rv = obj.GetResourceVersion()
			if ev.Type != watch.Bookmark {
				handle(ev.Type, obj)
			}
		}
	}
	return rv, nil
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
		}, nil)
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
		}, nil)
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

// podBudgetLog records, from a watch of a namespace's pods, every moment a
// workload (pods labelled app=<name>) had fewer healthy pods, Ready and not
// being deleted, than its PodDisruptionBudget's desired healthy count: what
// the disruption controller counts, seen on every pod change rather than
// sampled.
type podBudgetLog struct {
	mu         sync.Mutex
	minHealthy map[string]int
	healthy    map[string]map[string]bool // app -> pod -> healthy
	lowest     map[string]int
	violations []string
}

// watchPodBudgets starts recording; every app in minHealthy must have that
// many healthy pods from now on.
func watchPodBudgets(t *testing.T, ns string, minHealthy map[string]int) *podBudgetLog {
	t.Helper()
	l := &podBudgetLog{minHealthy: minHealthy, healthy: map[string]map[string]bool{}, lowest: map[string]int{}}
	armed := false
	startWatch(t, &corev1.PodList{}, []client.ListOption{client.InNamespace(ns)}, func(typ watch.EventType, obj client.Object) {
		pod := obj.(*corev1.Pod)
		app := pod.Labels["app"]
		if _, ok := minHealthy[app]; !ok {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.healthy[app] == nil {
			l.healthy[app] = map[string]bool{}
		}
		l.healthy[app][pod.Name] = typ != watch.Deleted && pod.DeletionTimestamp == nil && harness.PodReady(pod)
		if armed {
			l.record(app)
		}
	}, func() {
		// Every pod is listed: from here on each change is checked.
		l.mu.Lock()
		defer l.mu.Unlock()
		armed = true
		for app := range minHealthy {
			l.record(app)
		}
	})
	return l
}

// record notes app's healthy count now. Call with l.mu held.
func (l *podBudgetLog) record(app string) {
	n := 0
	for _, ok := range l.healthy[app] {
		if ok {
			n++
		}
	}
	if low, seen := l.lowest[app]; !seen || n < low {
		l.lowest[app] = n
	}
	if n < l.minHealthy[app] {
		l.violations = append(l.violations, fmt.Sprintf("%s: %d healthy pods, its PDB requires %d", app, n, l.minHealthy[app]))
	}
}

// check fails the test if any workload was ever below its PDB.
func (l *podBudgetLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) > 0 {
		t.Errorf("PodDisruptionBudgets were violated %d times, first: %s", len(l.violations), l.violations[0])
	}
}

// lowestHealthy is the fewest healthy pods each workload had.
func (l *podBudgetLog) lowestHealthy() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.lowest)
}

// nodeBudgetLog records, from a watch of a pool's nodes, every moment more of
// them were unavailable than a NodeDisruptionBudget allows: not Ready, being
// deleted, or carrying the draining or a signal taint.
type nodeBudgetLog struct {
	mu             sync.Mutex
	maxUnavailable int
	unavailable    map[string]bool
	armed          bool
	most           int
	violations     []string
}

// watchNodeBudget starts watching the nodes labelled soak-pool=pool; call arm
// once they are all up.
func watchNodeBudget(t *testing.T, pool string, maxUnavailable int) *nodeBudgetLog {
	t.Helper()
	l := &nodeBudgetLog{maxUnavailable: maxUnavailable, unavailable: map[string]bool{}}
	startWatch(t, &corev1.NodeList{}, []client.ListOption{client.MatchingLabels{soakPoolLabel: pool}}, func(typ watch.EventType, obj client.Object) {
		node := obj.(*corev1.Node)
		l.mu.Lock()
		defer l.mu.Unlock()
		if typ == watch.Deleted || !nodeUnavailable(node) {
			delete(l.unavailable, node.Name)
		} else {
			l.unavailable[node.Name] = true
		}
		if l.armed {
			l.record()
		}
	}, nil)
	return l
}

// arm checks every change from now on.
func (l *nodeBudgetLog) arm() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = true
	l.record()
}

// record notes the unavailable nodes now. Call with l.mu held.
func (l *nodeBudgetLog) record() {
	l.most = max(l.most, len(l.unavailable))
	if len(l.unavailable) > l.maxUnavailable {
		l.violations = append(l.violations, fmt.Sprintf("%d nodes unavailable at once (%v), the budget allows %d",
			len(l.unavailable), slices.Sorted(maps.Keys(l.unavailable)), l.maxUnavailable))
	}
}

// check fails the test if the budget was ever exceeded.
func (l *nodeBudgetLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) > 0 {
		t.Errorf("the NodeDisruptionBudget was exceeded %d times, first: %s", len(l.violations), l.violations[0])
	}
}

// mostUnavailable is the most nodes ever unavailable at once since arm.
func (l *nodeBudgetLog) mostUnavailable() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.most
}

// nodeUnavailable is a NodeDisruptionBudget's "unavailable", written out here
// rather than taken from nodeguard.
func nodeUnavailable(n *corev1.Node) bool {
	if n.DeletionTimestamp != nil || !nodeReady(n) {
		return true
	}
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		switch t.Key {
		case ngv1alpha1.DrainingTaintKey, ngv1alpha1.OutOfServiceTaintKey, ngv1alpha1.CloudShutdownTaintKey:
			return true
		}
		return t.Key == ngv1alpha1.SpotEvictionTaintKey && t.Value == ngv1alpha1.SpotEvictionTaintValue
	})
}

func nodeReady(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
	})
}
