package main

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

// perPoolWriters is the cut-over comparator: an admin-state updater with one
// writer per backend pool, all pools at once, which is what nodeguard did
// before it played ARM's rule that a load balancer has one ETag for all its
// pools. Like nodeguard it watches the nodes' taints and batches every
// pending node of a pool into one fresh GET and one PUT with If-Match. On a
// 412 it retries at once after a fresh GET, the most favourable retry there
// is (nodeguard waited --azure-admin-state-retry-interval, 5 s).
type perPoolWriters struct {
	client armclient.Client

	mu      sync.Mutex
	desired map[string]string // node name → "Down" or "None"
	wake    []chan struct{}
}

// poolRef names a backend pool.
type poolRef struct{ lb, name string }

// perPoolMaxAttempts bounds a pool's writes for one change (412s included).
const perPoolMaxAttempts = 10

// benchToken is the placeholder credential for the ARM emulator.
type benchToken struct{}

func (benchToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "bench", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// startPerPoolWriters watches the nodes matching selector and keeps the pools
// at armURL in line with their out-of-service taint until ctx ends.
func startPerPoolWriters(ctx context.Context, cfg *rest.Config, selector, armURL string, pools []poolRef) (*perPoolWriters, error) {
	c, err := armclient.New(armclient.Settings{
		SubscriptionID: subscription, Credential: benchToken{}, InsecureAllowHTTP: true,
		Cloud: cloud.Configuration{ActiveDirectoryAuthorityHost: "https://login.invalid/", Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: armURL, Audience: armURL},
		}},
	})
	if err != nil {
		return nil, err
	}
	w := &perPoolWriters{client: c, desired: map[string]string{}}
	for _, p := range pools {
		wake := make(chan struct{}, 1)
		w.wake = append(w.wake, wake)
		go w.run(ctx, p, wake)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	if err := watchSynced(ctx, f, f.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
		AddFunc:    w.observe,
		UpdateFunc: func(_, obj any) { w.observe(obj) },
	}); err != nil {
		return nil, err
	}
	return w, nil
}

// observe records a node's desired admin state and, when it changed, wakes
// every pool's writer.
func (w *perPoolWriters) observe(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	want := "None"
	for _, t := range n.Spec.Taints {
		if t.Key == outOfService.Key {
			want = "Down"
		}
	}
	w.mu.Lock()
	changed := w.desired[n.Name] != want
	w.desired[n.Name] = want
	w.mu.Unlock()
	if !changed {
		return
	}
	for _, wake := range w.wake {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// run is one pool's writer. A change that arrives during a write wakes it
// again, so the next write carries it.
func (w *perPoolWriters) run(ctx context.Context, p poolRef, wake <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
		for range perPoolMaxAttempts {
			err := w.write(ctx, p)
			var re *azcore.ResponseError
			if err == nil || ctx.Err() != nil {
				break
			}
			if errors.As(err, &re) && re.StatusCode == http.StatusPreconditionFailed {
				continue // another pool's write moved the ETag: fresh GET at once
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// write is one fresh GET and, when an entry's admin state must change, one
// PUT with If-Match.
func (w *perPoolWriters) write(ctx context.Context, p poolRef) error {
	pool, err := w.client.GetPool(ctx, resourceGroup, p.lb, p.name)
	if err != nil || pool.Properties == nil {
		return err
	}
	w.mu.Lock()
	changed := false
	for _, e := range pool.Properties.LoadBalancerBackendAddresses {
		if e == nil || e.Name == nil || e.Properties == nil {
			continue
		}
		want, ok := w.desired[*e.Name]
		if !ok {
			continue
		}
		down := e.Properties.AdminState != nil && *e.Properties.AdminState == armnetwork.LoadBalancerBackendAddressAdminStateDown
		if (want == "Down") != down {
			e.Properties.AdminState = ptr.To(armnetwork.LoadBalancerBackendAddressAdminState(want))
			changed = true
		}
	}
	w.mu.Unlock()
	if !changed {
		return nil
	}
	_, err = w.client.UpdatePool(ctx, resourceGroup, p.lb, pool)
	return err
}
