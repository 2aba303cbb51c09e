package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	if got, want := loadCell(loads), "replicaset 20.0/s (3 of 3 whole seconds at the limit), disruption 5.0/s"; got != want {
		t.Errorf("loadCell = %q, want %q", got, want)
	}
}

// TestBusiestWritesPerPodIsTheHighestMedianOfOneController: the throughput
// term takes one controller's writes (each has its own client limit), per
// replaced pod, median over each drainer's runs, the fewer of the drainers';
// a run in which a controller wrote nothing counts 0 for it, and the sum over
// controllers is never taken.
func TestBusiestWritesPerPodIsTheHighestMedianOfOneController(t *testing.T) {
	load := func(name string, own int) controllerLoad {
		return controllerLoad{Controller: name, Writes: own + 7, Own: own} // +7 in other namespaces: not counted
	}
	kubectl := [][]controllerLoad{
		{load("replicaset-controller", 150), load("disruption-controller", 100), load("deployment-controller", 60)},
		{load("replicaset-controller", 160), load("disruption-controller", 200)},
		{load("replicaset-controller", 170), load("disruption-controller", 120)},
	}
	name, perPod := busiestWritesPerPod(50, kubectl)
	if name != "replicaset-controller" || perPod != 3.2 {
		t.Errorf("busiestWritesPerPod = %s %.2f, want replicaset-controller 3.20 (the median, not disruption's one busy run)", name, perPod)
	}
	if got := writesPerPod(kubectl, "deployment-controller", 50); got != 0 {
		t.Errorf("deployment-controller, in one run of three: %.2f per pod, want the median 0", got)
	}
	if got := writesPerPod(kubectl[:2], "replicaset-controller", 50); got != 3 {
		t.Errorf("of two runs: %.2f per pod, want the lower middle 3.00", got)
	}
	// A drainer whose pace let the ReplicaSet controller write less per pod
	// sets its figure; the disruption controller's stays kubectl's, and is
	// now the busiest.
	other := [][]controllerLoad{{load("replicaset-controller", 100), load("disruption-controller", 140)}}
	if name, perPod := busiestWritesPerPod(50, kubectl, other); name != "disruption-controller" || perPod != 2.4 {
		t.Errorf("with a second drainer: %s %.2f, want disruption-controller 2.40", name, perPod)
	}
	if name, perPod := busiestWritesPerPod(50, kubectl, nil); name != "replicaset-controller" || perPod != 3.2 {
		t.Errorf("a drainer with no runs changes nothing: %s %.2f, want replicaset-controller 3.20", name, perPod)
	}
	if name, perPod := busiestWritesPerPod(50); name != "" || perPod != 0 {
		t.Errorf("no runs: %q %.2f, want none", name, perPod)
	}
}

func TestDrainersTakeTurnsGoingFirst(t *testing.T) {
	if first, second := drainOrder(1)[0], drainOrder(2)[0]; first == second {
		t.Errorf("repetitions 1 and 2 both start with %s", first)
	}
	if got := drainAuditPolicy([]string{"cycle", "kubectl-1"}); !strings.Contains(got, `namespaces: ["cycle", "kubectl-1"]`) {
		t.Errorf("audit policy does not name the namespaces:\n%s", got)
	}
}

// TestAuditTailReadsOnlyNewCompleteLines: the quiet wait follows the audit
// log as kube-apiserver appends to it: a line still being written is read
// once complete, and writers other than kube-controller-manager's
// controllers do not count.
func TestAuditTailReadsOnlyNewCompleteLines(t *testing.T) {
	at := time.Date(2026, 11, 26, 19, 0, 0, 0, time.UTC)
	line := func(agent string, t time.Time) string {
		return fmt.Sprintf(`{"userAgent":%q,"requestReceivedTimestamp":%q,"objectRef":{"namespace":"kubectl-1"}}`+"\n", agent, t.Format(time.RFC3339Nano))
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	first := line("kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/replicaset-controller", at) +
		line("kwok/v0.8.0", at.Add(time.Second))
	if err := os.WriteFile(path, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	tail := &auditTail{path: path}
	if got, err := tail.lastControllerWrite(); err != nil || !got.Equal(at) {
		t.Fatalf("lastControllerWrite = %v, %v; want %v (kwok's later write does not count)", got, err, at)
	}
	next := line("kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/disruption-controller", at.Add(2*time.Second))
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(next[:20]); err != nil { // half a line
		t.Fatal(err)
	}
	if got, err := tail.lastControllerWrite(); err != nil || !got.Equal(at) {
		t.Fatalf("with half a line: %v, %v; want still %v", got, err, at)
	}
	if _, err := f.WriteString(next[20:]); err != nil {
		t.Fatal(err)
	}
	if got, err := tail.lastControllerWrite(); err != nil || !got.Equal(at.Add(2*time.Second)) {
		t.Fatalf("with the line complete: %v, %v; want %v", got, err, at.Add(2*time.Second))
	}
}
