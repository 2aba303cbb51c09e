package armclient

import (
	"context"
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

func newClientWithVMs(t *testing.T, vms ...string) (Client, *armemulator.Server) {
	t.Helper()
	c, emu, _ := newClient(t, armemulator.Options{})
	for _, id := range vms {
		emu.AddVM(id)
	}
	return c, emu
}
