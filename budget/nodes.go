package budget

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeLister lists cached nodes as pointers into the manager's cache: read
// only. A List through the cached client copies every node into a new slice
// (about a kilobyte a node, even without a deep copy); budget status passes
// and scale-down look-ups run on every budget write, so at 2,000 nodes a fleet
// deletion allocated hundreds of megabytes that way.
type NodeLister struct {
	informers cache.Informers
	// reader lists when the cache's informer does not expose its store.
	reader client.Reader
}

// NewNodeLister reads the nodes of the manager's cache (informers), or
// through reader where that cache has no store to read.
func NewNodeLister(informers cache.Informers, reader client.Reader) *NodeLister {
	return &NodeLister{informers: informers, reader: reader}
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
		return l.list(ctx, sel)
	}
	var out []*corev1.Node
	for _, o := range withStore.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok && sel.Matches(labels.Set(n.Labels)) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (l *NodeLister) list(ctx context.Context, sel labels.Selector) ([]*corev1.Node, error) {
	var nodes corev1.NodeList
	if err := l.reader.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	out := make([]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		out[i] = &nodes.Items[i]
	}
	return out, nil
}
