package armemulator

import (
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// SetInterfaceVM attaches a standalone NIC to a VM (its full resource ID), as
// when a VMAS or VMSS flex VM is rebuilt around an existing NIC; vmID ""
// detaches it. A NIC the emulator does not have is created.
func (s *Server) SetInterfaceVM(nicID, vmID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := strings.ToLower(nicID)
	n, ok := s.nics[k]
	if !ok {
		n.ID = nicID
	}
	n.VirtualMachineID = vmID
	s.nics[k] = n
}

// DeleteInterface removes a NIC: a GET of it then answers 404.
func (s *Server) DeleteInterface(nicID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nics, strings.ToLower(nicID))
}

// interfaceView is a NIC as ARM returns it. A detached NIC has no
// virtualMachine property at all.
func (s *Server) interfaceView(n NetworkInterfaceSeed) armnetwork.Interface {
	segs := strings.Split(n.ID, "/")
	nic := armnetwork.Interface{
		ID: ptr(n.ID), Name: ptr(segs[len(segs)-1]), Location: ptr(s.seed.Location), Etag: ptr(`W/"nic"`),
		Type: ptr("Microsoft.Network/networkInterfaces"),
		Properties: &armnetwork.InterfacePropertiesFormat{
			ProvisioningState: ptr(armnetwork.ProvisioningStateSucceeded),
			IPConfigurations: []*armnetwork.InterfaceIPConfiguration{{
				ID: ptr(n.ID + "/ipConfigurations/ipconfig1"), Name: ptr("ipconfig1"),
			}},
		},
	}
	if n.VirtualMachineID != "" {
		nic.Properties.VirtualMachine = &armnetwork.SubResource{ID: ptr(n.VirtualMachineID)}
	}
	return nic
}
