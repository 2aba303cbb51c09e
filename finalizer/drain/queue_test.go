package drain

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// evictionAPI plays the Eviction API: it answers 429 to the pods in refuse
// (once each) and 200 to the rest, and logs every request.
type evictionAPI struct {
	mu     sync.Mutex
	refuse map[string]bool
	sent   []string // "name 200" or "name 429"
}

func (a *evictionAPI) client() client.Client {
	return fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		SubResourceCreate: func(_ context.Context, _ client.Client, sub string, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.refuse[obj.GetName()] {
				delete(a.refuse, obj.GetName())
				a.sent = append(a.sent, obj.GetName()+" 429")
				return budgetRefusal()
			}
			a.sent = append(a.sent, obj.GetName()+" 200")
			return nil
		},
	}).Build()
}

func (a *evictionAPI) log() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sent)
}

// webPDB is PDB web, generation 1, its status for that generation allowing
// allowed disruptions.
func webPDB(allowed int32) *policyv1.PodDisruptionBudget {
	pdb := &policyv1.PodDisruptionBudget{}
	pdb.UID, pdb.Generation = "pdb-web", 1
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: 1, DisruptionsAllowed: allowed}
	return pdb
}

// queuePlan is a plan of one queue, the pods under the PDB, as its status
// allows.
func queuePlan(pdb *policyv1.PodDisruptionBudget, pods ...*corev1.Pod) *Plan {
	return &Plan{Groups: []Group{{UID: pdb.UID, Pods: pods, Allowed: pdb.Status.DisruptionsAllowed, Budget: pdb}}}
}

// waitFor polls until the log has n requests.
func (a *evictionAPI) waitFor(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(a.log()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("eviction requests %v, want %d", a.log(), n)
		}
		time.Sleep(time.Millisecond)
	}
	return a.log()
}

// TestParkedQueueGoesOnWithEachStatus: a queue sends as many evictions of
// Ready pods as its PDB's status allowed, then parks without a request that
// could only be refused; each Wake (a status allowing disruptions again) sends
// the next ones, a 429 parks the rest in order, and the first request of a
// wake-up is reported once.
func TestParkedQueueGoesOnWithEachStatus(t *testing.T) {
	api := &evictionAPI{refuse: map[string]bool{"web-3": true}}
	e := &Evictor{Client: api.client()}
	var pods []*corev1.Pod
	for _, name := range []string{"web-1", "web-2", "web-3", "web-4"} {
		p := pod(name, "web", ready)
		pods = append(pods, &p)
	}
	pdb := webPDB(1)
	plan := queuePlan(pdb, pods...)

	out := e.Evict(context.Background(), "node", plan)
	if got := api.log(); out.Evicted != 1 || !slices.Equal(got, []string{"web-1 200"}) {
		t.Fatalf("first pass sent %v (evicted %d), want only web-1: the status allowed one", got, out.Evicted)
	}
	if !e.Waiting(pdb.UID) {
		t.Fatal("the queue did not park")
	}

	wakeups := 0
	sending := func() { wakeups++ }
	if !e.Wake(context.Background(), statusOf(pdb, "2", 2, "web-1"), sending) {
		t.Fatal("Wake found no parked queue")
	}
	// web-2 goes, web-3 is refused: web-3 and web-4 park, in order.
	if got := api.waitFor(t, 2+1); !slices.Equal(got, []string{"web-1 200", "web-2 200", "web-3 429"}) {
		t.Fatalf("after the first wake-up: %v", got)
	}
	waitParked(t, e, pdb.UID)
	if !e.Wake(context.Background(), statusOf(pdb, "3", 1, "web-1", "web-2"), sending) {
		t.Fatal("Wake found no parked queue after the 429")
	}
	if got := api.waitFor(t, 4); !slices.Equal(got[3:], []string{"web-3 200"}) {
		t.Fatalf("after the second wake-up: %v, want web-3 (web-4 waits: one allowed)", got)
	}
	waitParked(t, e, pdb.UID)
	if wakeups != 2 {
		t.Errorf("%d wake-ups reported, want 2", wakeups)
	}

	e.Forget("node")
	if e.Wake(context.Background(), statusOf(pdb, "4", 1), nil) {
		t.Error("a forgotten node's queue was woken")
	}
}

// statusOf is the PDB at a later resourceVersion whose status allows the
// disruptions and lists the disrupted pods (the evictions it counts).
func statusOf(pdb *policyv1.PodDisruptionBudget, version string, allowed int32, disrupted ...string) *policyv1.PodDisruptionBudget {
	p := pdb.DeepCopy()
	p.ResourceVersion, p.Status.DisruptionsAllowed = version, allowed
	p.Status.DisruptedPods = map[string]metav1.Time{}
	for _, name := range disrupted {
		p.Status.DisruptedPods[name] = metav1.Now()
	}
	return p
}

// TestGrantedEvictionsCountUntilAStatusShowsThem: two nodes drain pods under
// one PDB that allows one disruption. The first node's pass evicts web-a. The
// second node's passes send nothing (each would be refused with 429) while
// the PDB cache shows statuses that do not count that grant: the same status
// the grant spent, and a newer one that the disruption controller wrote from
// before the eviction (allowing one, not listing web-a). The eviction's own
// status (web-a disrupted, none allowed) is seen; a later status that allows
// one again and no longer lists web-a (the controller saw it go) counts it
// too, and web-b goes.
func TestGrantedEvictionsCountUntilAStatusShowsThem(t *testing.T) {
	api := &evictionAPI{}
	e := &Evictor{Client: api.client()}
	pdb := webPDB(1)
	pdb.ResourceVersion = "1"
	planOf := func(pdb *policyv1.PodDisruptionBudget, name string) *Plan {
		p := pod(name, "web", ready)
		return queuePlan(pdb, &p)
	}

	e.Evict(context.Background(), "node-a", planOf(pdb, "web-a"))
	e.Evict(context.Background(), "node-b", planOf(pdb, "web-b"))
	if got := api.log(); !slices.Equal(got, []string{"web-a 200"}) {
		t.Fatalf("evictions %v, want only web-a: the status allowed one, and web-a spent it", got)
	}
	if !e.Waiting(pdb.UID) {
		t.Fatal("node-b's queue did not park")
	}
	e.Evict(context.Background(), "node-b", planOf(statusOf(pdb, "2", 1), "web-b"))
	if got := api.log(); !slices.Equal(got, []string{"web-a 200"}) {
		t.Fatalf("evictions %v: web-b was sent under a newer status that does not count web-a's grant", got)
	}
	e.Seen(statusOf(pdb, "3", 0, "web-a"))
	e.Evict(context.Background(), "node-b", planOf(statusOf(pdb, "4", 1), "web-b"))
	if got := api.log(); !slices.Equal(got, []string{"web-a 200", "web-b 200"}) {
		t.Fatalf("evictions %v, want web-b once a status after the one showing web-a allows it", got)
	}
}

// waitParked polls until the PDB's queue is parked again (Wake runs in the
// background).
func waitParked(t *testing.T, e *Evictor, pdb types.UID) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !e.Waiting(pdb) {
		if time.Now().After(deadline) {
			t.Fatal("the queue did not park again")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnprotectedPodIsEvictedOnce: a pass whose pods predate its node's last
// evictions (the watch has not shown them terminating yet) does not send
// them again; it counts them evicted, so the node is not taken for one that
// waits only on budgets. A pod whose eviction failed is sent again.
func TestUnprotectedPodIsEvictedOnce(t *testing.T) {
	api := &evictionAPI{refuse: map[string]bool{}}
	e := &Evictor{Client: api.client(), Parallel: 4}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}}
	}
	plan := &Plan{Unprotected: []*corev1.Pod{pod("a"), pod("b")}}
	if out := e.Evict(context.Background(), "node", plan); out.Evicted != 2 {
		t.Fatalf("first pass evicted %d, want 2", out.Evicted)
	}
	out := e.Evict(context.Background(), "node", plan)
	if got := api.log(); len(got) != 2 {
		t.Errorf("eviction requests %v, want a and b once each", got)
	}
	if out.Evicted != 2 {
		t.Errorf("the second pass counts %d evicted, want 2 (granted before)", out.Evicted)
	}
	api.refuse["c"] = true
	failed := &Plan{Unprotected: []*corev1.Pod{pod("c")}}
	e.Evict(context.Background(), "node", failed)
	e.Evict(context.Background(), "node", failed)
	if got := api.log(); !slices.Equal(got[2:], []string{"c 429", "c 200"}) {
		t.Errorf("eviction requests %v, want c refused, then sent again", got)
	}
	e.Forget("node") // its pods are gone: a pod of that name again is new
	e.Evict(context.Background(), "node", &Plan{Unprotected: []*corev1.Pod{pod("a")}})
	if got := api.log(); len(got) != 5 {
		t.Errorf("eviction requests %v after the node's pods went, want a sent again", got)
	}
}

// TestEvictedControllersAreThoseOfGrantedEvictions: the controllers whose pod
// was granted an eviction from the node, not those refused, nor those of
// another node. They outlast the node's pods (Forget: its replacements may
// come after its pods are gone) and go with the node (ForgetNode).
func TestEvictedControllersAreThoseOfGrantedEvictions(t *testing.T) {
	api := &evictionAPI{refuse: map[string]bool{"refused": true}}
	e := &Evictor{Client: api.client(), Parallel: 4}
	ownedPod := func(name string, controller types.UID) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: string(controller), UID: controller, Controller: ptr.To(true)}}}}
	}
	e.Evict(context.Background(), "node", &Plan{Unprotected: []*corev1.Pod{ownedPod("proxy", "proxy-ds"), ownedPod("refused", "csi-ds")}})
	e.Evict(context.Background(), "other", &Plan{Unprotected: []*corev1.Pod{ownedPod("agent", "agent-ds")}})
	if got := e.EvictedControllers("node"); !maps.Equal(got, map[types.UID]bool{"proxy-ds": true}) {
		t.Errorf("evicted controllers %v, want only proxy-ds (csi-ds was refused, agent-ds is another node's)", got)
	}
	e.Forget("node")
	if got := e.EvictedControllers("node"); !maps.Equal(got, map[types.UID]bool{"proxy-ds": true}) {
		t.Errorf("evicted controllers %v once the node's pods were forgotten, want proxy-ds still", got)
	}
	e.ForgetNode("node")
	if got := e.EvictedControllers("node"); len(got) != 0 {
		t.Errorf("evicted controllers %v after the node was forgotten, want none", got)
	}
}

// TestPassDoesNotWaitForAnotherQueueUnderItsPDB: node a's pass evicts web-a
// under PDB web, and the API server holds that eviction. Node b's pass, whose
// pod is under the same PDB, returns at once with its queue deferred, and
// sends nothing while the PDB's other eviction is in flight (the PDB is
// Busy: node b's passes take no drain slot to wait for it): a pass that
// waited would hold node b's next pass, its release included. Once web-a's
// eviction is answered, web-b goes (the PDB allowed two).
func TestPassDoesNotWaitForAnotherQueueUnderItsPDB(t *testing.T) {
	arrived, answer := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var sent []string
	e := &Evictor{Client: fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		SubResourceCreate: func(_ context.Context, _ client.Client, _ string, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
			if obj.GetName() == "web-a" {
				close(arrived)
				<-answer
			}
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, obj.GetName())
			return nil
		},
	}).Build()}
	sentNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sent)
	}
	pdb := webPDB(2)
	planOf := func(name string) *Plan {
		p := pod(name, "web", ready)
		return queuePlan(pdb, &p)
	}

	doneA := make(chan Outcome)
	go func() { doneA <- e.Evict(context.Background(), "a", planOf("web-a")) }()
	<-arrived
	passB := make(chan Outcome)
	go func() { passB <- e.Evict(context.Background(), "b", planOf("web-b")) }()
	select {
	case out := <-passB:
		if out.Deferred != 1 || out.Evicted != 0 {
			t.Errorf("node b's pass: %+v, want its queue deferred and nothing evicted yet", out)
		}
	case <-time.After(10 * time.Second):
		close(answer)
		t.Fatal("node b's pass waited for node a's eviction under the same PDB")
	}
	if got := sentNow(); len(got) != 0 {
		t.Errorf("evictions answered %v while web-a's was in flight, want none: one at a time per PDB", got)
	}
	if !e.Busy(pdb.UID) {
		t.Error("PDB web is not busy while web-a's eviction is in flight: node b's pass would take a drain slot to wait")
	}

	close(answer)
	if out := <-doneA; out.Evicted != 1 {
		t.Errorf("node a's pass evicted %d, want web-a", out.Evicted)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(sentNow(), []string{"web-a", "web-b"}) {
		if time.Now().After(deadline) {
			t.Fatalf("evictions %v, want web-b after web-a: its deferred queue goes once web-a's is answered", sentNow())
		}
		time.Sleep(time.Millisecond)
	}
	for e.Busy(pdb.UID) { // web-b's queue lets go of the lock once its eviction is answered
		if time.Now().After(deadline) {
			t.Fatal("PDB web is still busy once both evictions were answered")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDeferredQueueOfAForgottenNodeSendsNothing: a queue deferred behind
// another under its PDB does not run once its node was forgotten meanwhile
// (its pods went, and the evictions it remembered with them): it would send
// an eviction for every pod, each answered 404.
func TestDeferredQueueOfAForgottenNodeSendsNothing(t *testing.T) {
	api := &evictionAPI{}
	e := &Evictor{Client: api.client()}
	pdb := webPDB(2)
	p := pod("web-c", "web", ready)
	plan := queuePlan(pdb, &p)

	lock := e.lockFor(pdb.UID) // another queue evicts under the PDB
	lock.Lock()
	if out := e.Evict(context.Background(), "c", plan); out.Deferred != 1 {
		lock.Unlock()
		t.Fatalf("pass %+v, want its queue deferred", out)
	}
	e.Forget("c")
	lock.Unlock()
	// Nothing to poll for: the deferred queue, had it run, would have sent
	// web-c at once.
	time.Sleep(200 * time.Millisecond)
	if got := api.log(); len(got) != 0 {
		t.Errorf("evictions %v sent for a forgotten node, want none", got)
	}
}
