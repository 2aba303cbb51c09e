package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// What kube-controller-manager's controllers write for a drain, from
// kube-apiserver's audit log. Each controller has a client of its own, limited
// to --kube-api-qps requests a second (the harness keeps the default, 20, with
// a burst of 30): when a drain keeps every PDB of a node cycling, the
// ReplicaSet controller's pod creates, status updates and events can reach
// that limit, and then the cluster, not the drainer, sets the pace.

// kcmClientQPS is kube-controller-manager's default --kube-api-qps, which the
// harness does not change.
const kcmClientQPS = 20

// drainAuditPolicy logs the writes in the drain section's namespaces: the
// drained pods' controllers at work, and nothing of the other sections that
// share the cluster.
var drainAuditPolicy = fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  verbs: ["get", "list", "watch"]
- level: Metadata
  namespaces: [%q, %q]
- level: None
`, kubectlNS, nodeguardNS)

// controllerLoad is one controller's writes in the drain section's namespaces
// while a drainer drained: both drainers' pods share each controller's
// client, so its limit holds for their sum.
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
// 20.0/s (7 of 7 whole seconds at the limit; 13.1/s for this drainer's
// pods), disruption 14.2/s".
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
			part += fmt.Sprintf(" (%d of %d whole seconds at the limit; %.1f/s for this drainer's pods)", l.AtLimit, l.Seconds, l.PerSecond*float64(l.Own)/float64(l.Writes))
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}
