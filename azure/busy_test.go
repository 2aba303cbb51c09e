package azure

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

// stillWaiting reports whether WaitConfirmed is still waiting (neither
// confirmed nor failed) for a node's state.
func (e *testEnv) stillWaiting(n *corev1.Node, state AdminState) bool {
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Millisecond)
	defer cancel()
	return errors.Is(e.m.WaitConfirmed(ctx, n.UID, state), context.DeadlineExceeded)
}

// busyRetryAfter is the emulator's Retry-After for a busy load balancer.
const busyRetryAfter = 10 * time.Second

// TestBusyLoadBalancerIsWaitedOut: another writer's operation keeps the
// public load balancer busy for far longer than the retry budget lasts (six
// Retry-Afters, MaxRetries 3). Busy is not failure: the node's Down stays
// pending, WaitConfirmed keeps waiting, one Warning says why, no retry is
// spent; when the operation ends the entry goes Down at the next attempt.
func TestBusyLoadBalancerIsWaitedOut(t *testing.T) {
	e := newEnv(t, 2, false)
	n0 := e.nodes[0]
	end := e.emu.BeginOperation("kubernetes")
	failuresBefore := failures()
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	if got := e.state("kubernetes-internal", "kubernetes", n0.Name); got != "Down" {
		t.Fatalf("internal pool = %s, want Down (its load balancer is not busy)", got)
	}
	for range 6 {
		e.step(busyRetryAfter)
		e.tick()
	}
	if got := e.puts(publicPool); got != 7 {
		t.Errorf("%d PUTs to the busy load balancer, want 7 (one per Retry-After)", got)
	}
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("public pool = %s while busy", got)
	}
	if !e.stillWaiting(n0, AdminStateDown) {
		t.Errorf("WaitConfirmed ended while the load balancer was busy, want it waiting")
	}
	if w := e.m.nodes[n0.UID].pools["kubernetes/kubernetes"]; w.retries != 0 || !w.pending {
		t.Errorf("work while busy = %+v, want pending with no retry spent", *w)
	}
	e.wantReasons(n0.Name, ReasonUpdateRetrying)
	if evs := e.rec.all(); !strings.Contains(evs[0].note, "another operation is updating") {
		t.Errorf("busy event = %q, want it to say another operation is updating the load balancer", evs[0].note)
	}

	end()
	e.step(busyRetryAfter)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantConfirmed(n0, AdminStateDown)
	e.wantReasons(n0.Name, ReasonUpdateRetrying, ReasonDown)
	if failures() != failuresBefore {
		t.Errorf("failure metric recorded for a busy load balancer")
	}
}

// TestRunOf412sNeverFails: a pool answered 412 more times in a row than
// the retry budget allows (MaxRetries 1) is re-read and re-applied each
// time, backing off within the retry interval, and is never given up on.
func TestRunOf412sNeverFails(t *testing.T) {
	e := newEnv(t, 2, false, withMaxRetries(1))
	n0 := e.nodes[0]
	e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusPreconditionFailed, Times: 5})
	failuresBefore := failures()
	e.m.SetDesired(n0, AdminStateDown)
	for i := 0; i < 10 && e.state("kubernetes", "kubernetes", n0.Name) != "Down"; i++ {
		e.tick()
		e.step(time.Second)
	}
	e.wantStates(n0.Name, AdminStateDown)
	e.wantConfirmed(n0, AdminStateDown)
	e.wantReasons(n0.Name, ReasonDown)
	if got := e.puts(publicPool); got != 6 {
		t.Errorf("%d PUTs, want 6 (five 412s, then the write)", got)
	}
	if got := e.gets(publicPool); got != 6 {
		t.Errorf("%d GETs, want 6 (a fresh read before every write)", got)
	}
	if failures() != failuresBefore {
		t.Errorf("failure metric recorded for 412s")
	}
	for n, want := range map[int]time.Duration{1: 0, 2: 250 * time.Millisecond, 3: 500 * time.Millisecond, 6: 4 * time.Second, 9: 5 * time.Second} {
		if got := conflictDelay(n, 5*time.Second); got != want {
			t.Errorf("conflictDelay(%d) = %s, want %s", n, got, want)
		}
	}
}

// TestFailedEntryIsTriedAgain: an entry whose write failed is still wanted.
// A terminal error is reported once and tried again at the backoff's
// ceiling; exhausted retries back off from the retry interval. Once ARM
// answers again the entry goes Down without waiting for the resync.
func TestFailedEntryIsTriedAgain(t *testing.T) {
	t.Run("terminal", func(t *testing.T) {
		e := newEnv(t, 2, false)
		n0 := e.nodes[0]
		remove := e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusForbidden})
		e.m.SetDesired(n0, AdminStateDown)
		e.tick()
		e.wantReasons(n0.Name, ReasonUpdateFailed)
		var ufe *UpdateFailedError
		if err := e.m.WaitConfirmed(e.ctx, n0.UID, AdminStateDown); !errors.As(err, &ufe) {
			t.Fatalf("WaitConfirmed = %v, want UpdateFailedError", err)
		}
		e.step(failedRetryCeiling - time.Second)
		e.tick()
		if got := e.puts(publicPool); got != 1 {
			t.Errorf("%d PUTs before the backoff's ceiling, want 1", got)
		}
		if d := e.m.nextWake(); d > time.Second {
			t.Errorf("the loop sleeps %s, want at most the 1s left of the backoff", d)
		}
		e.step(time.Second)
		e.tick()
		if got := e.puts(publicPool); got != 2 {
			t.Errorf("%d PUTs at the backoff's ceiling, want 2", got)
		}
		e.wantReasons(n0.Name, ReasonUpdateFailed) // reported once
		remove()
		e.step(failedRetryCeiling)
		e.tick()
		e.wantStates(n0.Name, AdminStateDown)
		e.wantConfirmed(n0, AdminStateDown)
		e.wantReasons(n0.Name, ReasonUpdateFailed, ReasonDown)
	})
	t.Run("retries exhausted", func(t *testing.T) {
		e := newEnv(t, 2, false, withMaxRetries(0))
		n0 := e.nodes[0]
		remove := e.emu.AddFault(armemulator.Fault{Method: http.MethodPut, Path: publicPool, Status: http.StatusConflict})
		e.m.SetDesired(n0, AdminStateDown)
		e.tick()
		// Backoff: twice the retry interval (5s), doubling.
		for i, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second} {
			e.step(wait - time.Millisecond)
			e.tick()
			if got := e.puts(publicPool); got != i+1 {
				t.Fatalf("%d PUTs before backoff %d (%s) passed, want %d", got, i+1, wait, i+1)
			}
			e.step(time.Millisecond)
			e.tick()
			if got := e.puts(publicPool); got != i+2 {
				t.Fatalf("%d PUTs once backoff %d (%s) passed, want %d", got, i+1, wait, i+2)
			}
		}
		e.wantReasons(n0.Name, ReasonUpdateFailed)
		remove()
		e.step(failedRetryCeiling)
		e.tick()
		e.wantStates(n0.Name, AdminStateDown)
		e.wantReasons(n0.Name, ReasonUpdateFailed, ReasonDown)
	})
}

// revertOpenCount is the number of observations, and their sum, of the
// revert-open histogram of a pool.
func revertOpenCount(t *testing.T, pool string) (uint64, float64) {
	t.Helper()
	return revertOpenCountOf(t, pool, AdminStateDown)
}

// revertOpenCountOf is revertOpenCount for the reverts of either state.
func revertOpenCountOf(t *testing.T, pool string, state AdminState) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := revertOpen.WithLabelValues(pool, string(state)).(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestRevertDuringAnotherOperationIsUndoneWhenItEnds: another writer puts a
// held-down entry back to None and keeps its load balancer busy with an
// operation 30 s long. The verification finds the revert at once; the
// rewrite waits out the operation without giving up, sets the entry Down
// when it ends, and the revert-open histogram records how long it was open.
func TestRevertDuringAnotherOperationIsUndoneWhenItEnds(t *testing.T) {
	e := newEnv(t, 2, false, withMaxRetries(1))
	n0 := e.nodes[0]
	e.m.SetDesired(n0, AdminStateDown)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	count, sumBefore := revertOpenCount(t, "kubernetes/kubernetes")

	e.emu.MutatePool("kubernetes", "kubernetes", func(p *armnetwork.BackendAddressPool) {
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			a.Properties.AdminState = nil
		}
	})
	end := e.emu.BeginOperation("kubernetes")
	e.step(e.m.cfg.VerifyInterval)
	e.tick() // verification: reverted; the rewrite meets the operation
	e.wantReasons(n0.Name, ReasonDown, ReasonReverted, ReasonUpdateRetrying)
	for range 3 {
		e.step(busyRetryAfter)
		e.tick()
	}
	if got := e.state("kubernetes", "kubernetes", n0.Name); got != "None" {
		t.Fatalf("public pool = %s during the operation", got)
	}
	end()
	e.step(busyRetryAfter)
	e.tick()
	e.wantStates(n0.Name, AdminStateDown)
	e.wantReasons(n0.Name, ReasonDown, ReasonReverted, ReasonUpdateRetrying, ReasonDown)
	got, sum := revertOpenCount(t, "kubernetes/kubernetes")
	if got != count+1 {
		t.Fatalf("revert_open_seconds{pool=kubernetes/kubernetes} has %d observations, want %d", got, count+1)
	}
	if want := (4 * busyRetryAfter).Seconds(); sum-sumBefore < want {
		t.Errorf("revert_open_seconds observed %vs, want at least %vs (found, then four Retry-Afters)", sum-sumBefore, want)
	}
}
