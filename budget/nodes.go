package budget

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// NodeLister lists cached nodes as pointers into the manager's cache: read
// only. A List through the cached client copies every node into a new slice
// (about a kilobyte a node, even without a deep copy); budget status passes
// and scale-down look-ups run on every budget write, so at 2,000 nodes a fleet
// deletion allocated hundreds of megabytes that way.
type NodeLister struct {
	informers cache.Informers
}

// NewNodeLister reads the nodes of the manager's cache (informers).
func NewNodeLister(informers cache.Informers) *NodeLister {
	return &NodeLister{informers: informers}
}

// List returns the cached nodes sel selects (nil: every node), in no order.
// The informer starts on first use, as a cached List's would.
func (l *NodeLister) List(ctx context.Context, sel labels.Selector) ([]*corev1.Node, error) {
	if sel == nil {
		sel = labels.Everything()
	}
	informer, err := l.informers.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("node cache: %w", err)
	}
	withStore, ok := informer.(interface{ GetStore() toolscache.Store })
	if !ok {
		return nil, fmt.Errorf("node cache: its informer (%T) has no store to read", informer)
	}
	var out []*corev1.Node
	for _, o := range withStore.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok && sel.Matches(labels.Set(n.Labels)) {
			out = append(out, n)
		}
	}
	return out, nil
}
