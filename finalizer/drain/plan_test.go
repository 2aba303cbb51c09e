package drain

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

func pod(name, app string, mods ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name), Labels: map[string]string{"app": app}}}
	p.Status.Phase = corev1.PodRunning
	for _, m := range mods {
		m(&p)
	}
	return p
}

func annotated(k, v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Annotations = map[string]string{k: v} }
}
func phase(ph corev1.PodPhase) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func deleting(p *corev1.Pod)                     { p.DeletionTimestamp = ptr.To(metav1.NewTime(now)) }
func daemon(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "DaemonSet", Name: "ds", UID: "ds-uid", Controller: ptr.To(true)}}
}

var (
	now  = time.Date(2026, 11, 23, 6, 0, 0, 0, time.UTC)
	last = PlanOptions{DaemonSets: DaemonSetsLast, Now: now, StuckMargin: time.Minute}
)

func created(t time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

func ownedBy(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "owner", Controller: ptr.To(true)}}
	}
}

func toleratesAll(p *corev1.Pod) {
	p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
}

func pdb(name string, selector *metav1.LabelSelector) policyv1.PodDisruptionBudget {
	return policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pdb-" + name)}, Spec: policyv1.PodDisruptionBudgetSpec{Selector: selector}}
}

func app(a string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": a}}
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func TestNewPlan(t *testing.T) {
	pdbs := []policyv1.PodDisruptionBudget{
		pdb("web", app("web")), pdb("api", app("api")),
		pdb("dual-a", app("dual")), pdb("dual-b", app("dual")),
		pdb("nil-selector", nil), // matches nothing, as in the Eviction API
	}
	pods := []corev1.Pod{
		pod("web-1", "web"), pod("web-2", "web"), pod("api-1", "api"),
		pod("free-1", "free"),
		pod("dual-1", "dual"),
		pod("mirror", "web", annotated("kubernetes.io/config.mirror", "x")),
		pod("done", "web", phase(corev1.PodSucceeded)),
		pod("failed", "free", phase(corev1.PodFailed)),
		pod("keep", "free", annotated(ngv1alpha1.DoNotEvictAnnotation, "true")),
		pod("going", "web", deleting),
		pod("agent", "agent", daemon),
	}
	plan, err := NewPlan(pods, pdbs, last)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Groups) != 2 || plan.Groups[0].PDB.Name != "api" || plan.Groups[1].PDB.Name != "web" {
		t.Fatalf("groups = %+v, want api and web in name order", plan.Groups)
	}
	if got := names(plan.Groups[1].Pods); !slices.Equal(got, []string{"web-1", "web-2"}) {
		t.Errorf("web queue = %v", got)
	}
	for _, c := range []struct {
		what      string
		got, want []string
	}{
		{"unprotected", names(plan.Unprotected), []string{"free-1"}},
		{"multiple PDBs", names(plan.MultiplePDBs), []string{"dual-1"}},
		{"do-not-evict", names(plan.DoNotEvict), []string{"keep"}},
		{"terminating", names(plan.Terminating), []string{"going"}},
		{"DaemonSet pods held back", names(plan.Later), []string{"agent"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	// 2 web + 1 api + free + dual + keep + going + agent; mirror and finished pods ignored.
	if got := plan.Remaining(); got != 8 {
		t.Errorf("remaining = %d, want 8", got)
	}
}

func TestDaemonSetPodsGoLastOrStay(t *testing.T) {
	agent := pod("agent", "agent", daemon)
	lastPlan, _ := NewPlan([]corev1.Pod{agent}, nil, last)
	if got := names(lastPlan.Unprotected); !slices.Equal(got, []string{"agent"}) || len(lastPlan.Later) != 0 || lastPlan.Tier != TierReturning {
		t.Errorf("with nothing else left, the DaemonSet pod should be evicted: %+v", lastPlan)
	}
	skip, _ := NewPlan([]corev1.Pod{agent, pod("web-1", "web")}, nil, PlanOptions{DaemonSets: DaemonSetsSkip, Now: now})
	if skip.Remaining() != 1 || len(skip.Later) != 0 {
		t.Errorf("with skip, DaemonSet pods are not waited for: %+v", skip)
	}
	blocked, _ := NewPlan([]corev1.Pod{agent, pod("keep", "x", annotated(ngv1alpha1.DoNotEvictAnnotation, "true"))}, nil, last)
	if len(blocked.Later) != 1 || len(blocked.Unprotected) != 0 {
		t.Errorf("a do-not-evict pod still running keeps the DaemonSet pod: %+v", blocked)
	}
}

// Pods that would come straight back (a DaemonSet's, or any tolerating the
// draining and unschedulable taints) are evicted once: those created after
// the node began deleting are their replacements and are not waited for.
func TestReturningPodsAreEvictedOnceAndTheirReplacementsIgnored(t *testing.T) {
	deleted := now.Add(-time.Minute)
	o := PlanOptions{DaemonSets: DaemonSetsLast, Now: now, NodeDeleted: deleted}
	original := pod("proxy-a", "proxy", daemon, created(deleted.Add(-time.Hour)))
	replacement := pod("proxy-b", "proxy", daemon, created(deleted.Add(time.Second)))
	tolerant := pod("agent-a", "agent", toleratesAll, ownedBy("ReplicaSet"), created(deleted.Add(-time.Hour)))
	tolerantAgain := pod("agent-b", "agent", toleratesAll, ownedBy("ReplicaSet"), created(deleted.Add(time.Second)))
	plan, err := NewPlan([]corev1.Pod{original, replacement, tolerant, tolerantAgain}, nil, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(plan.Unprotected); !slices.Equal(got, []string{"agent-a", "proxy-a"}) || plan.Remaining() != 2 {
		t.Errorf("evicting %v (remaining %d), want only the originals", got, plan.Remaining())
	}
	plan, _ = NewPlan([]corev1.Pod{replacement, tolerantAgain}, nil, o)
	if plan.Remaining() != 0 {
		t.Errorf("only replacements left: remaining %d, want 0", plan.Remaining())
	}
	// A bare pod has no controller to put it back: created in the second of
	// the node's deletion, it is still evicted.
	bare := pod("debug", "debug", toleratesAll, created(deleted))
	if plan, _ := NewPlan([]corev1.Pod{bare}, nil, o); plan.Remaining() != 1 {
		t.Errorf("a bare tolerating pod is ignored as a replacement: remaining %d, want 1", plan.Remaining())
	}
	// A pod tolerating only the draining taint is scheduled elsewhere: ordinary.
	partial := pod("half", "x", func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: ngv1alpha1.DrainingTaintKey, Operator: corev1.TolerationOpExists}}
	})
	if tierOf(&partial) != TierOrdinary {
		t.Errorf("a pod tolerating only the draining taint is in tier %s", tierOf(&partial))
	}
}

// Creation and deletion times have whole seconds. A DaemonSet pod created in
// the second the node began deleting is the original (a node deleted right
// after its pods started) until nodeguard has evicted a pod of that
// DaemonSet from the node; after that it is the replacement.
func TestSameSecondPodIsTheOriginalUntilItsControllerLostOne(t *testing.T) {
	deleted := now.Add(-time.Minute)
	sameSecond := pod("proxy-a", "proxy", daemon, created(deleted))
	o := PlanOptions{DaemonSets: DaemonSetsLast, Now: now, NodeDeleted: deleted}
	if plan, _ := NewPlan([]corev1.Pod{sameSecond}, nil, o); !slices.Equal(names(plan.Unprotected), []string{"proxy-a"}) {
		t.Errorf("before any eviction, the pod of the deletion's second is not evicted: %+v", plan)
	}
	o.EvictedControllers = map[types.UID]bool{"other-uid": true}
	if plan, _ := NewPlan([]corev1.Pod{sameSecond}, nil, o); plan.Remaining() != 1 {
		t.Errorf("another controller's eviction made the pod a replacement: remaining %d, want 1", plan.Remaining())
	}
	o.EvictedControllers = map[types.UID]bool{"ds-uid": true}
	if plan, _ := NewPlan([]corev1.Pod{sameSecond}, nil, o); plan.Remaining() != 0 {
		t.Errorf("once a pod of its DaemonSet was evicted, the pod of the deletion's second is still waited for: remaining %d", plan.Remaining())
	}
}

func TestTiersFinishInOrder(t *testing.T) {
	critical := func(p *corev1.Pod) { p.Spec.PriorityClassName = "system-node-critical" }
	web := pod("web-1", "web")
	csi := pod("csi-1", "csi", critical)
	proxy := pod("proxy-1", "proxy", daemon)
	tests := []struct {
		name      string
		pods      []corev1.Pod
		wantTier  Tier
		wantEvict []string
	}{
		{"ordinary first", []corev1.Pod{web, csi, proxy}, TierOrdinary, []string{"web-1"}},
		{"a terminating ordinary pod holds the critical tier", []corev1.Pod{pod("web-2", "web", deleting), csi, proxy}, TierOrdinary, nil},
		{"then system-critical", []corev1.Pod{csi, proxy}, TierCritical, []string{"csi-1"}},
		{"DaemonSet pods last", []corev1.Pod{proxy}, TierReturning, []string{"proxy-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := NewPlan(tt.pods, nil, last)
			if err != nil {
				t.Fatal(err)
			}
			if plan.Tier != tt.wantTier || !slices.Equal(names(plan.Unprotected), tt.wantEvict) {
				t.Errorf("tier %s evicting %v, want tier %s evicting %v", plan.Tier, names(plan.Unprotected), tt.wantTier, tt.wantEvict)
			}
			if plan.Remaining() != len(tt.pods) {
				t.Errorf("remaining %d, want %d", plan.Remaining(), len(tt.pods))
			}
		})
	}
}

func TestTerminatingPodsAreGivenUpOn(t *testing.T) {
	since := func(d time.Duration, grace int64) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			// deleted d ago: the API server set deletionTimestamp to the end of its grace period
			p.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-d + time.Duration(grace)*time.Second)))
			p.DeletionGracePeriodSeconds = ptr.To(grace)
		}
	}
	tests := []struct {
		name      string
		pod       corev1.Pod
		opts      PlanOptions
		wantCause string // "": still waited for
	}{
		{"within grace and margin", pod("a", "x", since(80*time.Second, 30)), last, ""},
		{"past grace and margin", pod("a", "x", since(91*time.Second, 30)), last, GiveUpStuck},
		{"unreachable node, past its margin", pod("a", "x", since(UnreachableMargin, 30)), PlanOptions{Now: now, StuckMargin: time.Minute, Unreachable: true}, GiveUpUnreachable},
		{"unreachable node, just deleted", pod("a", "x", since(time.Second, 30)), PlanOptions{Now: now, StuckMargin: time.Minute, Unreachable: true}, ""},
		{"past the drain deadline", pod("a", "x", since(time.Second, 30)), PlanOptions{Now: now, PastDeadline: true}, GiveUpDeadline},
		{"no margin waits forever", pod("a", "x", since(time.Hour, 30)), PlanOptions{Now: now}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := NewPlan([]corev1.Pod{tt.pod}, nil, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			cause := ""
			if len(plan.GivenUp) == 1 {
				cause = plan.GivenUp[0].Cause
			}
			if wantRemaining := map[bool]int{true: 1, false: 0}[tt.wantCause == ""]; cause != tt.wantCause || plan.Remaining() != wantRemaining {
				t.Errorf("given up %+v (remaining %d), want cause %q", plan.GivenUp, plan.Remaining(), tt.wantCause)
			}
		})
	}
}

func TestEmptySelectorPDBCoversEveryPodOfItsNamespace(t *testing.T) {
	all := pdb("all", &metav1.LabelSelector{})
	other := pdb("elsewhere", &metav1.LabelSelector{})
	other.Namespace = "other"
	plan, err := NewPlan([]corev1.Pod{pod("a", "x"), pod("b", "y")}, []policyv1.PodDisruptionBudget{all, other}, last)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Groups) != 1 || plan.Groups[0].PDB.Name != "all" || len(plan.Groups[0].Pods) != 2 {
		t.Errorf("groups = %+v, want one queue of both pods under PDB all", plan.Groups)
	}
}

func ready(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

// TestBlockedQueuesSendNothing: a PDB whose current status allows no
// disruption blocks its queue while every pod is Ready, since an eviction
// would certainly get a 429; a pod that is not Ready is tried first and
// unblocks it, as the Eviction API may let unhealthy pods go.
func TestBlockedQueuesSendNothing(t *testing.T) {
	exhausted := pdb("web", app("web"))
	exhausted.Generation, exhausted.Status.ObservedGeneration = 2, 2
	stale := exhausted
	stale.Status.ObservedGeneration = 1
	allowing := exhausted
	allowing.Status.DisruptionsAllowed = 1
	tests := []struct {
		name        string
		pdb         policyv1.PodDisruptionBudget
		pods        []corev1.Pod
		wantBlocked bool
		wantFirst   string
	}{
		{"exhausted, all Ready", exhausted, []corev1.Pod{pod("web-1", "web", ready), pod("web-2", "web", ready)}, true, "web-1"},
		{"exhausted, one not Ready", exhausted, []corev1.Pod{pod("web-1", "web", ready), pod("web-2", "web")}, false, "web-2"},
		{"status not computed for the current spec", stale, []corev1.Pod{pod("web-1", "web", ready)}, false, "web-1"},
		{"allows one", allowing, []corev1.Pod{pod("web-1", "web", ready)}, false, "web-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := NewPlan(tt.pods, []policyv1.PodDisruptionBudget{tt.pdb}, last)
			if err != nil {
				t.Fatal(err)
			}
			g := plan.Groups[0]
			if g.Blocked != tt.wantBlocked || g.Pods[0].Name != tt.wantFirst {
				t.Errorf("blocked %v, first %s; want %v, %s", g.Blocked, g.Pods[0].Name, tt.wantBlocked, tt.wantFirst)
			}
			if !tt.wantBlocked {
				return
			}
			// No client: any request would panic.
			out := (&Evictor{}).Evict(context.Background(), "node", &Plan{Groups: []Group{g}})
			if len(out.Blocked) != 1 || out.Evicted != 0 || len(out.Errs) != 0 {
				t.Errorf("a blocked queue should be reported blocked without a request: %+v", out)
			}
		})
	}
}

// TestQueueOrderIsTheSameWhateverThePodsOrder: a watch's store hands pods in
// no order; the queue is always the pods not Ready first, then by name, so a
// parked queue and the next pass agree on the next pod.
func TestQueueOrderIsTheSameWhateverThePodsOrder(t *testing.T) {
	pdbs := []policyv1.PodDisruptionBudget{pdb("web", app("web"))}
	pods := []corev1.Pod{pod("web-0", "web", ready), pod("web-1", "web", ready), pod("web-2", "web"), pod("web-3", "web", ready)}
	want := []string{"web-2", "web-0", "web-1", "web-3"}
	for range 20 {
		shuffled := slices.Clone(pods)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		plan, err := NewPlan(shuffled, pdbs, last)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range plan.Groups[0].Pods {
			got = append(got, p.Name)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("queue %v from pods in order %v, want %v", got, podNames(shuffled), want)
		}
	}
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
