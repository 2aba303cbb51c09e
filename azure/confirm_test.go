package azure

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

// Confirmation answers without waiting (wait 0), or after at most wait:
// pending while a write is refused as busy, failed with the pool's error,
// confirmed once Azure confirmed, unknown for a node the manager does not
// track.
func TestConfirmation(t *testing.T) {
	e := newEnv(t, 2, false)
	n0, n1 := e.nodes[0], e.nodes[1]
	if got, err := e.m.Confirmation(e.ctx, types.UID("nobody"), AdminStateDown, 0); got != ConfirmUnknown || !errors.Is(err, ErrNotTracked) {
		t.Errorf("an untracked node: %v, %v; want unknown, ErrNotTracked", got, err)
	}

	end := e.emu.BeginOperation("kubernetes")
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	started := time.Now()
	if got, err := e.m.Confirmation(e.ctx, n0.UID, AdminStateDown, 0); got != ConfirmPending || err != nil {
		t.Errorf("a node whose write waits out a busy load balancer: %v, %v; want pending", got, err)
	}
	if waited := time.Since(started); waited > time.Second {
		t.Errorf("a question asked with no wait took %s", waited)
	}
	end()
	e.step(busyRetryAfter)
	e.tick()
	if got, err := e.m.Confirmation(e.ctx, n0.UID, AdminStateDown, time.Second); got != Confirmed || err != nil {
		t.Errorf("once Azure confirmed: %v, %v; want confirmed", got, err)
	}

	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusForbidden})
	e.m.SetDesired(n1, AdminStateDown)
	e.tick()
	var ufe *UpdateFailedError
	if got, err := e.m.Confirmation(e.ctx, n1.UID, AdminStateDown, 0); got != ConfirmFailed || !errors.As(err, &ufe) {
		t.Errorf("a write refused for good: %v, %v; want failed with the UpdateFailedError", got, err)
	}
}
