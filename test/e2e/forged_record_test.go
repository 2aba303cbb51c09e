package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The admin-state record's label and annotations (azure/leaserecords.go): what
// anyone who may write Leases in kube-node-maintenance can copy.
const (
	recordLabel             = "nodeguard.io/record"
	recordLabelValue        = "load-balancer-admin-state"
	recordPoolAnnotation    = "nodeguard.io/backend-pool"
	recordEntriesAnnotation = "nodeguard.io/entries-set-down"
)

// recordOwner is one entry of a record: the node it was set Down for.
type recordOwner struct {
	UID        string `json:"uid"`
	Node       string `json:"node"`
	GoneSince  string `json:"goneSince,omitempty"`
	RestoredAt string `json:"restoredAt,omitempty"`
}

// recordEntries reads a record Lease's entries.
func recordEntries(l *coordinationv1.Lease) (map[string]recordOwner, error) {
	var out map[string]recordOwner
	err := json.Unmarshal([]byte(l.Annotations[recordEntriesAnnotation]), &out)
	return out, err
}

// fleetEntryNames returns the node's entry names in the fleet's pools, by
// "lb/pool" (lower case, as nodeguard keys its records).
func fleetEntryNames(f *fleet, node string) map[string]string {
	out := map[string]string{}
	for pool, e := range f.entries(node) {
		out[strings.ToLower(pool)] = e.Name
	}
	return out
}

// TestForgedRecordChangesNothing (issue #62): another maintenance tool, which
// may write Leases in kube-node-maintenance as the KEP invites, creates a
// second admin-state record for each pool, with the label and annotations
// nodeguard's own record carries: it lists another node's entry as set Down
// by nodeguard (for an earlier incarnation of that node, as after a
// reimage), and omits the node nodeguard holds Down. That other node's
// entries are Down, set by someone else (an operator took it out). nodeguard
// restarts, so it loads the records: each forged Lease gets the Warning
// LoadBalancerAdminStateRecordIgnored and is left as it was; the held node is
// restored None as usual when its signal taint goes; and nodeguard never
// writes the other node's entries (their Down stays).
func TestForgedRecordChangesNothing(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	ctx := context.Background()
	f := newFleet(t, "forgedrec", 2)
	held, other := f.nodes[0], f.nodes[1]
	heldEntries, otherEntries := fleetEntryNames(f, held), fleetEntryNames(f, other)
	if len(heldEntries) != 2 || len(otherEntries) != 2 {
		t.Fatalf("entries %v and %v, want each node in the public and the internal pool", heldEntries, otherEntries)
	}
	// Someone else took the other node out of rotation.
	for _, p := range f.emulator.State() {
		name, ok := otherEntries[strings.ToLower(p.LoadBalancer+"/"+p.Pool)]
		if !ok {
			continue
		}
		f.emulator.MutatePool(p.LoadBalancer, p.Pool, func(bp *armnetwork.BackendAddressPool) {
			for _, e := range bp.Properties.LoadBalancerBackendAddresses {
				if e.Name != nil && *e.Name == name {
					e.Properties.AdminState = ptr.To(armnetwork.LoadBalancerBackendAddressAdminStateDown)
				}
			}
		})
	}
	ng := startNodeguard(t, env.Kubeconfig, f.emulator)

	shutdown := corev1.Taint{Key: ngv1alpha1.CloudShutdownTaintKey, Effect: corev1.TaintEffectNoSchedule}
	patchTaints(t, held, func(ts []corev1.Taint) []corev1.Taint { return append(ts, shutdown) })
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) { return f.allStates(held, "Down"), nil },
		"the shut-down node %s is Down", held)
	// nodeguard's own record of each pool lists the held node.
	own := map[string]*coordinationv1.Lease{} // by pool
	harness.Eventually(t, 30*time.Second, func(ctx context.Context) (bool, error) {
		var leases coordinationv1.LeaseList
		if err := env.Client.List(ctx, &leases, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace), client.MatchingLabels{recordLabel: recordLabelValue}); err != nil {
			return false, err
		}
		for i := range leases.Items {
			l := &leases.Items[i]
			entries, err := recordEntries(l)
			pool := l.Annotations[recordPoolAnnotation]
			if err == nil && entries[heldEntries[pool]].Node == held {
				own[pool] = l
			}
		}
		return len(own) == len(heldEntries), nil
	}, "nodeguard's records of both pools list %s", held)

	// The forger: a maintenance tool's ServiceAccount that may write Leases
	// in kube-node-maintenance, and nothing else.
	forgerName := f.pool + "-tool"
	forgerUser := "system:serviceaccount:" + f.pool + ":" + forgerName
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: forgerName},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: forgerName},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: forgerName},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: forgerUser}}}
	harness.MustCreate(t, env.Client, role)
	harness.MustCreate(t, env.Client, binding)
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
	forger, err := env.AsUser(forgerUser, "system:serviceaccounts", "system:serviceaccounts:"+f.pool)
	if err != nil {
		t.Fatal(err)
	}
	earlier := string(uuid.NewUUID()) // the other node before a reimage
	forged := map[string]*coordinationv1.Lease{}
	i := 0
	for pool, l := range own {
		i++
		entries, err := json.Marshal(map[string]recordOwner{otherEntries[pool]: {UID: earlier, Node: other}})
		if err != nil {
			t.Fatal(err)
		}
		// Named to sort after nodeguard's own (lb-admin-state-...): a
		// reader that took the last record listed for a pool would take it.
		fake := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: fmt.Sprintf("tool-%s-record-%d", f.pool, i),
			Labels:      maps.Clone(l.Labels),
			Annotations: map[string]string{recordPoolAnnotation: l.Annotations[recordPoolAnnotation], recordEntriesAnnotation: string(entries)},
		}}
		// The RBAC cache may lag the binding a moment.
		harness.Eventually(t, 10*time.Second, func(ctx context.Context) (bool, error) {
			return forger.Create(ctx, fake) == nil, nil
		}, "the maintenance tool creates Lease %s", fake.Name)
		forged[pool] = fake
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), fake) })
	}
	for _, pool := range slices.Sorted(maps.Keys(forged)) {
		t.Logf("pool %s: forged record %s beside nodeguard's %s", pool, forged[pool].Name, own[pool].Name)
	}

	// nodeguard restarts (an upgrade, a failover): it loads the records.
	if err := ng.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	metricsPort := harness.FreePort(t)
	startNodeguard(t, env.Kubeconfig, f.emulator, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metricsPort), "--metrics-secure=false")
	for pool, l := range forged {
		harness.WaitForEvent(t, env.Client, l.Name, "LoadBalancerAdminStateRecordIgnored")
		notes := eventNotes(ctx, t, l.Name, "LoadBalancerAdminStateRecordIgnored")
		if len(notes) != 1 || !strings.Contains(notes[0], pool) || !strings.Contains(notes[0], own[pool].Name) {
			t.Errorf("LoadBalancerAdminStateRecordIgnored on %s: %q, want one naming pool %s and nodeguard's record %s", l.Name, notes, pool, own[pool].Name)
		}
	}
	if got := scrapeSum(t, metricsPort, "loadbalancer_adminstate_ignored_records_total", ""); got < float64(len(forged)) {
		t.Errorf("loadbalancer_adminstate_ignored_records_total = %v, want at least the %d forged records", got, len(forged))
	}
	if !f.allStates(held, "Down") {
		t.Errorf("after the restart %s is %v, want still Down", held, f.states(held))
	}

	// The signal goes: the held node is restored as usual.
	restoredFrom := time.Now()
	patchTaints(t, held, func(ts []corev1.Taint) []corev1.Taint {
		var out []corev1.Taint
		for _, x := range ts {
			if x.Key != shutdown.Key {
				out = append(out, x)
			}
		}
		return out
	})
	// Not fatal: what happened to the other node is to be checked too.
	if err := harness.Poll(ctx, 30*time.Second, func(context.Context) (bool, error) { return f.allStates(held, "None"), nil }); err != nil {
		t.Errorf("%s (omitted by the forged records) is %v 30 s after its taint went, want None: %v", held, f.states(held), err)
	} else {
		t.Logf("%s restored None %s after its taint went", held, time.Since(restoredFrom).Round(time.Millisecond))
	}

	// The other node's entries are as someone else left them: no nodeguard
	// write ever changed them.
	if !f.allStates(other, "Down") {
		t.Errorf("%s is %v, want Down as its operator set it", other, f.states(other))
	}
	last := map[string]string{} // "lb/pool" → the other node's state
	for _, w := range f.emulator.History() {
		pool := strings.ToLower(w.LoadBalancer + "/" + w.Pool)
		name, ok := otherEntries[pool]
		if !ok {
			continue
		}
		state := ""
		for _, e := range w.Entries {
			if e.Name == name {
				state = e.AdminState
			}
		}
		if prev, seen := last[pool]; seen && prev != state && armemulator.ByNodeguard(w) {
			t.Errorf("nodeguard's write of %s at %s changed %s's entry from %s to %s", pool, w.Time.Format(time.RFC3339Nano), other, prev, state)
		}
		last[pool] = state
	}
	// The forged Leases are as the tool wrote them, and nodeguard's own
	// records never took in what they list.
	for pool, fake := range forged {
		var now coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(fake), &now); err != nil {
			t.Errorf("forged record %s: %v", fake.Name, err)
			continue
		}
		if now.ResourceVersion != fake.ResourceVersion {
			t.Errorf("forged record %s was written (resourceVersion %s, created %s): %v", fake.Name, now.ResourceVersion, fake.ResourceVersion, now.Annotations)
		}
		var mine coordinationv1.Lease
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(own[pool]), &mine)
		if client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		if entries, _ := recordEntries(&mine); err == nil && entries[otherEntries[pool]].Node == other {
			t.Errorf("nodeguard's record %s took in the forged entry of %s: %v", mine.Name, other, entries)
		}
	}
}
