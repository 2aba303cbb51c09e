package taintwatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/test/harness"
)

// The done-when of "Down never outlives its node", on a real API server with
// the records in Leases: a node deleted while Down and re-registered under
// its name (VMSS reimage: a new UID) ends with its entries None; a Down
// another writer set on a node is left alone; both across a nodeguard
// restart in between.
func TestDownNeverOutlivesItsNodeAcrossRestart(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	reimaged, bystander := vmssNode("gone-reimaged", 20), vmssNode("gone-bystander", 21)
	emu := startEmulator(t, reimaged, bystander)
	createNode(t, reimaged)
	createNode(t, bystander)
	stop := startNodeguard(t, emu, nodeguardOptions{maxRetries: 3})

	updateTaints(t, reimaged.name, withTaint(outOfService))
	waitEntries(t, emu, reimaged.name, "Down")
	// Another writer takes one of the bystander's entries Down; nodeguard
	// then takes the bystander Down too (a signal) and restores it later.
	foreign := "kubernetes-internal/kubernetes/" + bystander.name
	setEntryDown(t, emu, "kubernetes-internal", "kubernetes", bystander.name)
	updateTaints(t, bystander.name, withTaint(outOfService))
	waitEntries(t, emu, bystander.name, "Down")
	if n := recordLeases(t); n == 0 {
		t.Fatal("no admin-state record Lease while entries are Down")
	}

	stop()
	deleteNode(t, reimaged.name)
	updateTaints(t, bystander.name, withoutTaint(outOfService.Key))
	again := createNode(t, reimaged) // same name, new UID
	startNodeguard(t, emu, nodeguardOptions{maxRetries: 3})

	waitEntries(t, emu, reimaged.name, "None")
	waitEvent(t, again, azure.ReasonRestoredAfterNodeGone)
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		es := entries(emu, bystander.name)
		for k, v := range es {
			if k != foreign && v != "None" {
				return false, nil
			}
		}
		return len(es) == entriesPerNode, nil
	}, "the bystander's entries nodeguard set Down are None again")
	if got := emu.AdminStates()[foreign]; got != "Down" {
		t.Errorf("the Down another writer set on %s = %s, want it left Down", foreign, got)
	}
	// Restored entries stay recorded for the restore hold (held None, not
	// Down): what must go is every entry recorded Down.
	harness.Eventually(t, waitTimeout, func(ctx context.Context) (bool, error) {
		downs, err := azure.ListRecordedDowns(ctx, env.Client, ngv1alpha1.MaintenanceLeaseNamespace)
		return err == nil && len(downs) == 0, err
	}, "no entry is recorded Down once every entry nodeguard set Down is restored")
}

func setEntryDown(t *testing.T, emu interface {
	MutatePool(lb, name string, mutate func(*armnetwork.BackendAddressPool)) bool
}, lb, pool, entry string) {
	t.Helper()
	ok := emu.MutatePool(lb, pool, func(p *armnetwork.BackendAddressPool) {
		for _, a := range p.Properties.LoadBalancerBackendAddresses {
			if a.Name != nil && *a.Name == entry {
				s := armnetwork.LoadBalancerBackendAddressAdminStateDown
				a.Properties.AdminState = &s
			}
		}
	})
	if !ok {
		t.Fatalf("no pool %s/%s", lb, pool)
	}
}

// recordLeases counts the admin-state record Leases.
func recordLeases(t *testing.T) int {
	t.Helper()
	var list coordinationv1.LeaseList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace),
		client.MatchingLabels{"nodeguard.io/record": "load-balancer-admin-state"}); err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// One record Lease that does not parse does not stop the admin-state writes:
// nodeguard skips it with a Warning event on the Lease and takes a node Down
// as usual, in the pool the bad record names too.
func TestUnreadableRecordIsSkipped(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	n := vmssNode("record-unreadable", 22)
	emu := startEmulator(t, n)
	createNode(t, n)
	bad := map[string]map[string]string{
		recordLeaseName("kubernetes-internal/kubernetes"): {"nodeguard.io/backend-pool": "kubernetes-internal/kubernetes", "nodeguard.io/entries-set-down": "{not json"},
		"record-no-pool": {"nodeguard.io/entries-set-down": "{}"},
	}
	for name, annotations := range bad {
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Namespace: ngv1alpha1.MaintenanceLeaseNamespace, Name: name, Annotations: annotations,
			Labels: map[string]string{"nodeguard.io/record": "load-balancer-admin-state"},
		}}
		harness.MustCreate(t, env.Client, lease)
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), lease) })
	}
	startNodeguard(t, emu, nodeguardOptions{maxRetries: 3})

	updateTaints(t, n.name, withTaint(outOfService))
	waitEntries(t, emu, n.name, "Down")
	for name := range bad {
		harness.WaitForEvent(t, env.Client, name, azure.ReasonRecordUnreadable)
	}
}

// recordLeaseName is the name of a pool's record Lease (azure/leaserecords.go).
func recordLeaseName(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return "lb-admin-state-" + hex.EncodeToString(sum[:10])
}

// A node taken Down and deleted that registers again under its name (a VMSS
// reimage or a re-created node keeps name and address), Ready and without a
// signal, has its entries None at once, not after the gone-node grace
// period: whether nodeguard saw the deletion while running, or only read it
// from its records after a restart.
func TestReRegisteredNodeIsNoneAtOnce(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	live, restarted := vmssNode("back-live", 23), vmssNode("back-restarted", 24)
	emu := startEmulator(t, live, restarted)
	createNode(t, live)
	createNode(t, restarted)
	stop := startNodeguard(t, emu, nodeguardOptions{maxRetries: 3, goneGrace: time.Hour})
	for _, n := range []testNode{live, restarted} {
		updateTaints(t, n.name, withTaint(outOfService))
		waitEntries(t, emu, n.name, "Down")
		deleteNode(t, n.name)
	}

	// Seen while running.
	again := createNode(t, live)
	waitEntries(t, emu, live.name, "None")
	waitEvent(t, again, azure.ReasonRestoredAfterNodeGone)

	// Known gone from the records only: nodeguard stamped since when the old
	// node is gone, stopped, and the node came back meanwhile.
	harness.Eventually(t, waitTimeout, func(context.Context) (bool, error) {
		return recordsGoneSince(t, restarted.name), nil
	}, "the records say since when %s is gone", restarted.name)
	stop()
	again = createNode(t, restarted)
	startNodeguard(t, emu, nodeguardOptions{maxRetries: 3, goneGrace: time.Hour})
	waitEntries(t, emu, restarted.name, "None")
	waitEvent(t, again, azure.ReasonRestoredAfterNodeGone)
}

// recordsGoneSince reports whether a record Lease names node as gone since
// a time.
func recordsGoneSince(t *testing.T, node string) bool {
	t.Helper()
	var list coordinationv1.LeaseList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ngv1alpha1.MaintenanceLeaseNamespace),
		client.MatchingLabels{"nodeguard.io/record": "load-balancer-admin-state"}); err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		entries := l.Annotations["nodeguard.io/entries-set-down"]
		if strings.Contains(entries, `"node":"`+node+`"`) && strings.Contains(entries, `"goneSince"`) {
			return true
		}
	}
	return false
}
