// Package leader reports leader election in metrics: whether this replica leads,
// and how often leadership has moved between replicas (this file). options.go
// holds the leader election flags and sets the manager's election from them.
package leader

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	isLeader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nodeguard_leader_is_leader",
		Help: "1 while this replica holds the leader election Lease and runs the controllers, 0 otherwise.",
	})
	changes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nodeguard_leader_changes_total",
		Help: "Number of times this replica saw the leader election Lease change holder.",
	})
)

func init() {
	metrics.Registry.MustRegister(isLeader, changes)
}

// Setup adds the leader metrics to a manager: a runnable that runs only while
// this replica leads, and an observer of the election Lease on every replica.
func Setup(mgr manager.Manager, lease types.NamespacedName) error {
	if err := mgr.Add(leading{}); err != nil {
		return err
	}
	return mgr.Add(&observer{cache: mgr.GetCache(), lease: lease})
}

// leading sets nodeguard_leader_is_leader while the manager runs leader-only work.
type leading struct{}

func (leading) NeedLeaderElection() bool { return true }

func (leading) Start(ctx context.Context) error {
	isLeader.Set(1)
	<-ctx.Done()
	isLeader.Set(0)
	return nil
}

// observer counts holder changes of the election Lease from the shared cache.
type observer struct {
	cache cache.Cache
	lease types.NamespacedName
}

func (*observer) NeedLeaderElection() bool { return false }

func (o *observer) Start(ctx context.Context) error {
	informer, err := o.cache.GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return err
	}
	_, err = informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			if HolderChanged(o.lease, oldObj, newObj) {
				changes.Inc()
			}
		},
	})
	return err
}

// HolderChanged reports whether an update of the named Lease changed its holder
// from one replica to another (acquiring a released Lease counts too).
func HolderChanged(lease types.NamespacedName, oldObj, newObj any) bool {
	oldLease, ok1 := oldObj.(*coordinationv1.Lease)
	newLease, ok2 := newObj.(*coordinationv1.Lease)
	if !ok1 || !ok2 || newLease.Namespace != lease.Namespace || newLease.Name != lease.Name {
		return false
	}
	holder := func(l *coordinationv1.Lease) string {
		if l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	return holder(newLease) != "" && holder(oldLease) != holder(newLease)
}
