package webhook

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PodNodes says which node a pod runs on, for the eviction webhook: an
// Eviction names only its pod. A reflector of every pod of the cluster keeps
// one map entry per pod, its namespace/name to its node (about 150 bytes),
// so that an eviction from a schedulable node is decided from memory. An
// informer's store of pods stripped to their name and node took about
// 3.5 KiB of RSS a pod at 40,000 pods (a whole Pod struct each, and the
// collector's headroom). Until its first list is in, it reads the pod from
// the API server.
type PodNodes struct {
	reflector *toolscache.Reflector
	mu        sync.RWMutex
	nodes     map[string]string // namespace/name → node, for scheduled pods
	synced    atomic.Bool
	// Reader reads a pod the reflector has not listed yet.
	Reader client.Reader
}

// NewPodNodes makes the pod locator; run it with the manager (every replica
// serves evictions, so it needs no leader election).
func NewPodNodes(cs kubernetes.Interface, reader client.Reader) *PodNodes {
	p := &PodNodes{nodes: map[string]string{}, Reader: reader}
	lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.Everything())
	p.reflector = toolscache.NewReflectorWithOptions(lw, &corev1.Pod{}, (*podNodeStore)(p), toolscache.ReflectorOptions{Name: "eviction webhook pod locator"})
	return p
}

// Start runs the reflector until ctx ends.
func (p *PodNodes) Start(ctx context.Context) error {
	p.reflector.RunWithContext(ctx)
	return nil
}

// NeedLeaderElection is false: every replica answers evictions.
func (p *PodNodes) NeedLeaderElection() bool { return false }

// NodeOf returns the node the pod runs on: "" for a pod that does not exist
// or is not scheduled. A pod the map does not have (created since its last
// event, or before the first list) is read from the API server.
func (p *PodNodes) NodeOf(ctx context.Context, namespace, name string) (string, error) {
	if p.synced.Load() {
		p.mu.RLock()
		node, ok := p.nodes[namespace+"/"+name]
		p.mu.RUnlock()
		if ok {
			return node, nil
		}
	}
	var pod corev1.Pod
	if err := p.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	}
	return pod.Spec.NodeName, nil
}

// podNodeStore is the reflector's store: it keeps each pod's node only.
type podNodeStore PodNodes

var _ toolscache.TransformingStore = (*podNodeStore)(nil)

func (s *podNodeStore) Add(obj any) error    { return s.set(obj) }
func (s *podNodeStore) Update(obj any) error { return s.set(obj) }
func (s *podNodeStore) Resync() error        { return nil }

func (s *podNodeStore) Delete(obj any) error {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, pod.Namespace+"/"+pod.Name)
	return nil
}

// set keeps a scheduled pod's node; a pod on no node needs no entry (NodeOf
// reads a missing one from the API server, and it is rare).
func (s *podNodeStore) set(obj any) error {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	key := pod.Namespace + "/" + pod.Name
	s.mu.Lock()
	defer s.mu.Unlock()
	if pod.Spec.NodeName == "" {
		delete(s.nodes, key)
	} else {
		s.nodes[key] = pod.Spec.NodeName
	}
	return nil
}

// Replace puts the list in place of everything, and marks the map synced.
func (s *podNodeStore) Replace(list []any, _ string) error {
	nodes := make(map[string]string, len(list))
	for _, obj := range list {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
			nodes[pod.Namespace+"/"+pod.Name] = pod.Spec.NodeName
		}
	}
	s.mu.Lock()
	s.nodes = nodes
	s.mu.Unlock()
	s.synced.Store(true)
	return nil
}

// Transformer strips the pods the reflector holds while a streamed first
// list comes in, as this store would.
func (s *podNodeStore) Transformer() toolscache.TransformFunc { return stripPod }

// stripPod keeps what the locator answers from: the key and the node.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
	}, nil
}
