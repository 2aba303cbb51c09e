package webhook

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PodNodes says which node a pod runs on, for the eviction webhook: an
// Eviction names only its pod. It keeps every pod of the cluster, each
// stripped to its name and node (a few dozen bytes, where a whole pod is
// several kilobytes), so that an eviction from a schedulable node is decided
// from memory. Until its first list is in, it reads the pod from the API
// server.
type PodNodes struct {
	informer toolscache.SharedIndexInformer
	// Reader reads a pod the informer has not synced yet.
	Reader client.Reader
}

// NewPodNodes makes the pod locator; run it with the manager (every replica
// serves evictions, so it needs no leader election).
func NewPodNodes(cs kubernetes.Interface, reader client.Reader) *PodNodes {
	lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.Everything())
	inf := toolscache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, toolscache.Indexers{})
	_ = inf.SetTransform(stripPod) // only fails once the informer runs
	return &PodNodes{informer: inf, Reader: reader}
}

// stripPod keeps what the locator answers from: the key and the node.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: the informer unwraps it
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
	}, nil
}

// Start runs the informer until ctx ends.
func (p *PodNodes) Start(ctx context.Context) error {
	p.informer.Run(ctx.Done())
	return nil
}

// NeedLeaderElection is false: every replica answers evictions.
func (p *PodNodes) NeedLeaderElection() bool { return false }

// NodeOf returns the node the pod runs on: "" for a pod that does not exist
// or is not scheduled. A pod the cache does not have yet (created since its
// last event) is read from the API server.
func (p *PodNodes) NodeOf(ctx context.Context, namespace, name string) (string, error) {
	if p.informer.HasSynced() {
		obj, exists, err := p.informer.GetStore().GetByKey(namespace + "/" + name)
		if err == nil && exists {
			return obj.(*corev1.Pod).Spec.NodeName, nil
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
