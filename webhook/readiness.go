package webhook

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// AddReadyzChecks makes a replica Ready, and so sent Service traffic, once
// its webhook server has started (when it serves one) and the manager's
// caches have synced: the webhook server starts before the caches, and until
// they sync every decision read from them waits out its time budget and
// answers "retry".
func AddReadyzChecks(mgr ctrl.Manager, serving bool) error {
	started := healthz.Ping
	if serving {
		started = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("webhook", started); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache()))
}

// cachesSynced is a readiness check that passes once the manager's informer
// caches have synced, and from then on without asking again.
func cachesSynced(c cache.Cache) healthz.Checker {
	var synced atomic.Bool
	return func(req *http.Request) error {
		if synced.Load() {
			return nil
		}
		ctx, cancel := context.WithTimeout(req.Context(), 100*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced yet")
		}
		synced.Store(true)
		return nil
	}
}
