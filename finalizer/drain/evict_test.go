package drain

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestDeferredQueueTakesTheLatestPlan: while another queue evicts under PDB
// web, node b's passes come again and again (each status of a PDB with a
// long queue wakes every node with a pod under it). One queue of node b
// waits for the PDB, not one per pass, and it evicts what node b's latest
// pass planned: web-b1, gone meanwhile, is not sent.
func TestDeferredQueueTakesTheLatestPlan(t *testing.T) {
	api := &evictionAPI{}
	e := &Evictor{Client: api.client()}
	pdb := webPDB(2)
	b1, b2 := pod("web-b1", "web", ready), pod("web-b2", "web", ready)

	lock := e.lockFor(pdb.UID) // another queue evicts under the PDB
	lock.Lock()
	before := runtime.NumGoroutine()
	for range 50 {
		if out := e.Evict(context.Background(), "b", queuePlan(pdb, &b1, &b2)); out.Deferred != 1 {
			lock.Unlock()
			t.Fatalf("pass %+v, want its queue deferred", out)
		}
	}
	e.Evict(context.Background(), "b", queuePlan(pdb, &b2)) // web-b1 went
	// A goroutine started by go is counted at once, running or not.
	if extra := runtime.NumGoroutine() - before; extra > 2 {
		t.Errorf("51 passes deferred behind the PDB left %d more goroutines, want the one queue waiting", extra)
	}
	lock.Unlock()
	api.waitFor(t, 1)
	deadline := time.Now().Add(10 * time.Second)
	for e.Busy(pdb.UID) { // the queue lets go of the lock at its end
		if time.Now().After(deadline) {
			t.Fatalf("evictions %v: the deferred queue did not run to its end once the PDB's lock was free", api.log())
		}
		time.Sleep(time.Millisecond)
	}
	if got := api.log(); !slices.Equal(got, []string{"web-b2 200"}) {
		t.Errorf("evictions %v, want web-b2's alone: the latest pass's plan", got)
	}
}
