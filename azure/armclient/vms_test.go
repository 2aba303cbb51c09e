package armclient

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

func TestVMResourceID(t *testing.T) {
	for providerID, want := range map[string]string{
		"azure:///subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-vmss/virtualMachines/3": "/subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-vmss/virtualMachines/3",
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/aks-pool-0":                            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/aks-pool-0",
		"kwok://node-0": "",
		"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic": "",
	} {
		got, err := VMResourceID(providerID)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("VMResourceID(%q) = %q, %v; want %q", providerID, got, err, want)
		}
	}
}

// A VM that exists answers 200; once deleted, 404 (ResourceNotFound for a
// standalone VM, NotFound for a VMSS instance): both are "gone".
func TestVMExists(t *testing.T) {
	vmss := "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/0"
	vm := "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-1"
	c, emu := newClientWithVMs(t, vmss, vm)
	for _, id := range []string{vmss, vm} {
		if ok, err := c.VMExists(context.Background(), id); err != nil || !ok {
			t.Errorf("VMExists(%s) = %v, %v; want true", id, ok, err)
		}
		emu.DeleteVM(id)
		if ok, err := c.VMExists(context.Background(), id); err != nil || ok {
			t.Errorf("after the delete, VMExists(%s) = %v, %v; want false, no error", id, ok, err)
		}
	}
}

// Only a 404 that says the VM itself is not found counts as gone: a wrong
// resource group or subscription in the providerID, an unknown resource type
// or an endpoint that is not ARM (a 404 with no ARM error body) is an error,
// whose code says which.
// An instance of a deleted scale set (a node pool deleted, `az vmss delete`)
// answers 404 ParentResourceNotFound: gone too, so that the cloud node
// lifecycle controller's deletes of its nodes are never refused.
func TestVMExistsAfterItsScaleSetIsDeleted(t *testing.T) {
	// The node resource group of AKS (MC_...) is not the seed's: it holds
	// nothing else here, and outlives the scale set all the same.
	for _, rg := range []string{"rg", "MC_rg_cluster_westeurope"} {
		set := "/subscriptions/sub/resourceGroups/" + rg + "/providers/Microsoft.Compute/virtualMachineScaleSets/pool2"
		c, emu := newClientWithVMs(t, set+"/virtualMachines/0", set+"/virtualMachines/1")
		if !emu.DeleteScaleSet(set) {
			t.Fatal("the emulator did not hold the scale set")
		}
		for _, id := range []string{set + "/virtualMachines/0", set + "/virtualMachines/1"} {
			if ok, err := c.VMExists(context.Background(), id); err != nil || ok {
				t.Errorf("after the scale set's delete, VMExists(%s) = %v, %v; want false, no error", id, ok, err)
			}
		}
	}
}

func TestVMExistsOtherNotFounds(t *testing.T) {
	vm := "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-1"
	c, _ := newClientWithVMs(t, vm)
	for _, tc := range []struct {
		name, id, wantCode string
	}{
		{"wrong resource group", "/subscriptions/sub/resourceGroups/other-rg/providers/Microsoft.Compute/virtualMachines/vm-1", "ResourceGroupNotFound"},
		{"wrong subscription", "/subscriptions/other-sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-1", "SubscriptionNotFound"},
		{"unknown resource type", "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/virtualMachinez/vm-1", "InvalidResourceType"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := c.VMExists(context.Background(), tc.id)
			if ok || !isUnknownVM(err, tc.wantCode) {
				t.Errorf("VMExists = %v, %v; want false and a VMUnknownError with code %s", ok, err, tc.wantCode)
			}
		})
	}
	t.Run("endpoint that is not ARM", func(t *testing.T) {
		notARM := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(notARM.Close)
		ok, err := newClientAt(t, notARM.URL).VMExists(context.Background(), vm)
		if ok || !isUnknownVM(err, "") {
			t.Errorf("VMExists = %v, %v; want false and a VMUnknownError without an ARM error code", ok, err)
		}
	})
}

func isUnknownVM(err error, code string) bool {
	var unknown *VMUnknownError
	return errors.As(err, &unknown) && unknown.Err.ErrorCode == code
}

func newClientWithVMs(t *testing.T, vms ...string) (Client, *armemulator.Server) {
	t.Helper()
	c, emu, _ := newClient(t, armemulator.Options{})
	for _, id := range vms {
		emu.AddVM(id)
	}
	return c, emu
}
