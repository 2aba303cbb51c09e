package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/test/harness"
)

// What kube-controller-manager's controllers write for a drain, from
// kube-apiserver's audit log. Each controller has a client of its own (the
// controller manager builds one per controller, named in its user agent, and
// the controller's events go through it too), and each client has its own
// token bucket: --kube-api-qps requests a second, --kube-api-burst at once.
// The harness keeps the defaults. Replacing drained pods makes the ReplicaSet
// controller create pods and write statuses and events, and the disruption
// controller write PDB statuses: the busiest of them can set the pace of a
// drain, whatever the drainer does.

// kcmClientQPS and kcmClientBurst are kube-controller-manager's default
// --kube-api-qps and --kube-api-burst, which the harness does not change.
const (
	kcmClientQPS   = 20
	kcmClientBurst = 30
)

// drainAuditPolicy logs the writes in the drain section's namespaces: the
// drained pods' controllers at work, and nothing of the other sections that
// share the cluster.
func drainAuditPolicy(namespaces []string) string {
	return fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  verbs: ["get", "list", "watch"]
- level: Metadata
  namespaces: ["%s"]
- level: None
`, strings.Join(namespaces, `", "`))
}

// controllerLoad is one controller's writes in the drain section's namespaces
// while a drainer drained.
type controllerLoad struct {
	Controller string `json:"controller"`
	Writes     int    `json:"writes"`
	// Own are the writes in the drainer's namespace.
	Own int `json:"own"`
	// PerSecond is Writes over the drain's time; AtLimit counts the whole
	// seconds of it in which the controller wrote at least kcmClientQPS - 1.
	PerSecond float64 `json:"perSecond"`
	AtLimit   int     `json:"secondsAtLimit"`
	Seconds   int     `json:"seconds"`
}

// auditWrite is the part of an audit event the load needs.
type auditWrite struct {
	UserAgent string    `json:"userAgent"`
	Received  time.Time `json:"requestReceivedTimestamp"`
	ObjectRef struct {
		Namespace string `json:"namespace"`
	} `json:"objectRef"`
}

// controllerLoads reads the audit log (drainAuditPolicy: the section's
// namespaces only) and returns the writes of each kube-controller-manager
// controller from from to to, those in namespace ns apart, busiest first.
func controllerLoads(auditLog, ns string, from, to time.Time) ([]controllerLoad, error) {
	f, err := os.Open(auditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seconds := int(to.Sub(from) / time.Second)
	perSecond := map[string][]int{} // controller → writes in each whole second
	writes, own := map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		var w auditWrite
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			return nil, fmt.Errorf("reading %s: %w", auditLog, err)
		}
		name, ok := controllerOf(w.UserAgent)
		if !ok || w.Received.Before(from) || w.Received.After(to) {
			continue
		}
		writes[name]++
		if w.ObjectRef.Namespace == ns {
			own[name]++
		}
		if perSecond[name] == nil {
			perSecond[name] = make([]int, seconds+1)
		}
		perSecond[name][int(w.Received.Sub(from)/time.Second)]++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []controllerLoad
	for name, n := range writes {
		l := controllerLoad{Controller: name, Writes: n, Own: own[name], PerSecond: float64(n) / to.Sub(from).Seconds(), Seconds: seconds}
		for _, k := range perSecond[name][:seconds] { // whole seconds only
			if k >= kcmClientQPS-1 {
				l.AtLimit++
			}
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b controllerLoad) int { return b.Writes - a.Writes })
	return out, nil
}

// controllersQuiet is how long kube-controller-manager must have written
// nothing in the drain namespaces before a drain run or an idle cycle starts:
// longer than burst ÷ qps, so every controller's token bucket is full again.
const controllersQuiet = 2 * time.Second

// auditTail follows the audit log for the last write of a
// kube-controller-manager controller.
type auditTail struct {
	path   string
	offset int64
	last   time.Time
}

// lastControllerWrite reads what the log gained since the previous call and
// returns when a controller last wrote.
func (a *auditTail) lastControllerWrite() (time.Time, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return a.last, err
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return a.last, err
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil { // io.EOF with a line still being written: read it next time
			return a.last, nil
		}
		a.offset += int64(len(line))
		var w auditWrite
		if err := json.Unmarshal(line, &w); err != nil {
			return a.last, fmt.Errorf("reading %s: %w", a.path, err)
		}
		if _, ok := controllerOf(w.UserAgent); ok && w.Received.After(a.last) {
			a.last = w.Received
		}
	}
}

// waitControllersQuiet waits until kube-controller-manager has written nothing
// in the drain namespaces for controllersQuiet: done with the last change,
// its clients' token buckets full. After a minute it goes on regardless, and
// says so.
func waitControllersQuiet(ctx context.Context, a *auditTail) error {
	if a == nil || a.path == "" {
		return nil
	}
	err := harness.Poll(ctx, time.Minute, func(context.Context) (bool, error) {
		last, err := a.lastControllerWrite()
		return time.Since(last) >= controllersQuiet, err
	})
	if err != nil && ctx.Err() == nil {
		logf("kube-controller-manager still writing after a minute (last write %s ago): going on", time.Since(a.last).Round(time.Millisecond))
		return nil
	}
	return err
}

// controllerOf names the kube-controller-manager controller of a user agent
// such as "kube-controller-manager/v1.34.0 (linux/amd64) kubernetes/abc/replicaset-controller".
func controllerOf(userAgent string) (string, bool) {
	if !strings.HasPrefix(userAgent, "kube-controller-manager/") {
		return "", false
	}
	i := strings.LastIndex(userAgent, "/")
	return userAgent[i+1:], i+1 < len(userAgent)
}

// loadCell says how busy the busiest controllers were, e.g. "replicaset
// 20.0/s (7 of 7 whole seconds at the limit), disruption 14.2/s".
func loadCell(loads []controllerLoad) string {
	if len(loads) == 0 {
		return "none"
	}
	var parts []string
	for i, l := range loads {
		if i == 3 {
			break
		}
		part := fmt.Sprintf("%s %.1f/s", strings.TrimSuffix(l.Controller, "-controller"), l.PerSecond)
		if i == 0 {
			part += fmt.Sprintf(" (%d of %d whole seconds at the limit)", l.AtLimit, l.Seconds)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// writesPerPod is the controller's writes per replaced pod in the drainer's
// own namespace, the median over the runs (a run where it wrote nothing
// counts 0; the lower middle of an even count). pods is the pods each run
// replaced.
func writesPerPod(runs [][]controllerLoad, controller string, pods int) float64 {
	if len(runs) == 0 || pods <= 0 {
		return 0
	}
	v := make([]float64, len(runs))
	for i, loads := range runs {
		for _, l := range loads {
			if l.Controller == controller {
				v[i] = float64(l.Own) / float64(pods)
			}
		}
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// busiestWritesPerPod is the controller with the most writes per replaced pod
// and that figure, where a controller's figure is the fewest of the drainers'
// (writesPerPod over each drainer's runs; a drainer with no runs is left
// out): what the cluster showed it can replace a pod with, so that a drainer
// whose pace makes the controllers write more does not raise the bound.
func busiestWritesPerPod(pods int, drainers ...[][]controllerLoad) (string, float64) {
	busiest, most := "", 0.0
	for _, runs := range drainers {
		for _, loads := range runs {
			for _, l := range loads {
				if m := fewestWritesPerPod(pods, l.Controller, drainers); m > most || (m == most && l.Controller < busiest) {
					busiest, most = l.Controller, m
				}
			}
		}
	}
	return busiest, most
}

func fewestWritesPerPod(pods int, controller string, drainers [][][]controllerLoad) float64 {
	fewest := -1.0
	for _, runs := range drainers {
		if len(runs) == 0 {
			continue
		}
		if w := writesPerPod(runs, controller, pods); fewest < 0 || w < fewest {
			fewest = w
		}
	}
	return max(fewest, 0)
}
