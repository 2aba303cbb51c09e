package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestControllerLoadsCountsEachControllersWritesInTheWindow: writes of
// kube-controller-manager's controllers are counted per controller in the
// drainer's window, over both drainers' namespaces (one client limit) with the
// drainer's own apart; a controller at its client limit in every whole second
// says so, one below it does not.
func TestControllerLoadsCountsEachControllersWritesInTheWindow(t *testing.T) {
	from := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	to := from.Add(3 * time.Second)
	const kcm = "kube-controller-manager/v1.34.0 (linux/amd64) kubernetes/abc/"
	var events []map[string]any
	add := func(agent, ns string, at time.Time) {
		events = append(events, map[string]any{"kind": "Event", "userAgent": agent, "requestReceivedTimestamp": at.Format(time.RFC3339Nano),
			"objectRef": map[string]any{"namespace": ns, "resource": "pods"}})
	}
	for i := range 3 * kcmClientQPS { // at the limit, every second, a quarter for the other drainer
		ns := "nodeguard"
		if i%4 == 0 {
			ns = "kubectl"
		}
		add(kcm+"replicaset-controller", ns, from.Add(time.Duration(i)*time.Second/kcmClientQPS))
	}
	for i := range 15 { // 5 a second
		add(kcm+"disruption-controller", "nodeguard", from.Add(time.Duration(i)*200*time.Millisecond))
	}
	add(kcm+"replicaset-controller", "nodeguard", from.Add(-time.Second))   // before the window
	add(kcm+"replicaset-controller", "nodeguard", to.Add(time.Millisecond)) // after it
	add("kwok/v0.8.0 (linux/amd64)", "nodeguard", from.Add(time.Second))    // not a controller
	path := filepath.Join(t.TempDir(), "audit.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	enc := json.NewEncoder(f)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	loads, err := controllerLoads(path, "nodeguard", from, to)
	if err != nil {
		t.Fatal(err)
	}
	if len(loads) != 2 {
		t.Fatalf("loads %+v, want the ReplicaSet and disruption controllers", loads)
	}
	rs, pdb := loads[0], loads[1]
	if rs.Controller != "replicaset-controller" || rs.Writes != 3*kcmClientQPS || rs.Own != 3*kcmClientQPS*3/4 || rs.AtLimit != 3 || rs.Seconds != 3 || rs.PerSecond != kcmClientQPS {
		t.Errorf("ReplicaSet controller %+v, want %d writes (%d in the drainer's namespace), %d/s, 3 of 3 seconds at the limit", rs, 3*kcmClientQPS, 3*kcmClientQPS*3/4, kcmClientQPS)
	}
	if pdb.Controller != "disruption-controller" || pdb.Writes != 15 || pdb.AtLimit != 0 {
		t.Errorf("disruption controller %+v, want 15 writes, no second at the limit", pdb)
	}
	if got, want := loadCell(loads), "replicaset 20.0/s (3 of 3 whole seconds at the limit; 15.0/s for this drainer's pods), disruption 5.0/s"; got != want {
		t.Errorf("loadCell = %q, want %q", got, want)
	}
}
