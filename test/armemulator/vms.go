// Virtual machines: enough of Microsoft.Compute for "does this node's VM
// still exist?" (GET of a standalone VM or a VMSS instance), and for tests to
// delete a VM as cluster-autoscaler or a user would.

package armemulator

import (
	"net/http"
	"strings"
)

// vmKey is the lookup key of a VM ID.
func vmKey(id string) string { return strings.ToLower(strings.TrimPrefix(id, "azure://")) }

// DeleteVM removes a VM (by resource ID or providerID); later GETs answer
// 404. It reports whether the VM existed.
func (s *Server) DeleteVM(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := vmKey(id)
	if !s.vms[k] {
		return false
	}
	delete(s.vms, k)
	return true
}

// VMExists reports whether the emulator holds the VM.
func (s *Server) VMExists(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vms[vmKey(id)]
}

// getVM serves GET .../providers/Microsoft.Compute/virtualMachines/{vm} and
// .../virtualMachineScaleSets/{set}/virtualMachines/{instance}. A missing VM
// is 404 ResourceNotFound; a missing VMSS instance 404 NotFound, the codes
// Azure answers with (cloud-provider-azure treats any 404 as gone).
func (s *Server) getVM(w http.ResponseWriter, path string) {
	s.mu.Lock()
	exists := s.vms[vmKey(path)]
	s.mu.Unlock()
	parts := strings.Split(strings.Trim(path, "/"), "/")
	name := parts[len(parts)-1]
	if !exists {
		code := "ResourceNotFound"
		if strings.Contains(strings.ToLower(path), "/virtualmachinescalesets/") {
			code = "NotFound"
		}
		writeError(w, http.StatusNotFound, code, "The Resource '"+strings.Join(parts[4:], "/")+"' under resource group '"+parts[3]+"' was not found.")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id":       path,
		"name":     name,
		"location": s.seed.Location,
		"properties": map[string]any{
			"provisioningState": "Succeeded",
		},
	})
}

// AddVM adds a VM (by resource ID or providerID).
func (s *Server) AddVM(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vms[vmKey(id)] = true
}
