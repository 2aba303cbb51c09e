package plugin

import (
	"slices"
	"strings"
	"time"

	"github.com/nodeguard/nodeguard/finalizer/drain"
	"github.com/nodeguard/nodeguard/finalizer/foresight"
)

// The replacement throughput model, as test/bench measures it: the busiest
// controller (the ReplicaSet controller) writes about 4 requests per
// replaced pod (3.1 to 4.8 in the bench's drains), from a token bucket of
// kube-controller-manager's --kube-api-burst (30) that starts full.
const (
	writesPerReplacement = 4
	controllerBurst      = 30
)

// estimate is a drain's time from its PDB chains: tier after tier, each as
// long as its longest chain, a chain being its PDB's pods on the node in
// rounds of what the PDB allows, one PodCycle between rounds (the first goes
// at once); but no less than kube-controller-manager needs to write the
// replacements the last evictions wait for (throughput). A blocked PDB, a do-not-evict pod or a pod under several PDBs
// make the drain wait for something that does not end by itself: until the
// drain deadline (the node's drain timeout, 0: none), if there is one.
func estimate(plans []*drain.Plan, found []foresight.Finding, deadline time.Duration, o PlanOptions) (time.Duration, string) {
	var total time.Duration
	var blocked []string
	gating := 0 // replacements that must be Ready before the last evictions
	for _, plan := range plans {
		var longest time.Duration
		for _, g := range plan.Groups {
			pods := int64(len(g.Pods))
			switch {
			case g.Blocked && g.ByDesign && replaces(found, g):
				longest = max(longest, time.Duration(pods)*o.PodCycle) // the restart replaces them one by one
				gating += int(pods)
			case g.Blocked:
				blocked = append(blocked, "PDB "+g.PDB.String())
			default:
				rounds := (pods + int64(max(g.Allowed, 1)) - 1) / int64(max(g.Allowed, 1))
				longest = max(longest, time.Duration(rounds-1)*o.PodCycle)
				gating += max(int(pods)-int(max(g.Allowed, 1)), 0)
			}
		}
		if len(plan.DoNotEvict) > 0 {
			blocked = append(blocked, "do-not-evict pods")
		}
		if len(plan.MultiplePDBs) > 0 {
			blocked = append(blocked, "pods under several PDBs")
		}
		total += longest
	}
	if len(blocked) == 0 {
		return max(total, throughput(gating, o.ControllerQPS)), ""
	}
	if deadline > 0 {
		return deadline, "until its drain deadline: " + strings.Join(blocked, ", ")
	}
	return 0, "never by itself: " + strings.Join(blocked, ", ")
}

// throughput is the least time kube-controller-manager needs to write the
// replacements that gate a drain, at qps with its burst.
func throughput(gating, qps int) time.Duration {
	if qps <= 0 {
		return 0
	}
	writes := gating*writesPerReplacement - controllerBurst
	return time.Duration(max(writes, 0)) * time.Second / time.Duration(qps)
}

// replaces reports whether nodeguard restarts g's Deployment first, as the
// finding for g says.
func replaces(found []foresight.Finding, g drain.Group) bool {
	return slices.ContainsFunc(found, func(f foresight.Finding) bool {
		return f.Kind == foresight.BlockedPDB && f.PDB == g.PDB.String() && f.Replaced
	})
}
