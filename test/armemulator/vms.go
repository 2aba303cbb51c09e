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

// DeleteScaleSet removes a scale set (by resource ID) and every instance of
// it, as deleting a node pool does; later GETs of its instances answer 404
// ParentResourceNotFound. It reports whether the scale set existed.
func (s *Server) DeleteScaleSet(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := vmKey(id)
	if !s.scaleSets[set] {
		return false
	}
	delete(s.scaleSets, set)
	for k := range s.vms {
		if scaleSetOf(k) == set {
			delete(s.vms, k)
		}
	}
	return true
}

// getVM serves GET .../providers/Microsoft.Compute/virtualMachines/{vm} and
// .../virtualMachineScaleSets/{set}/virtualMachines/{instance} with ARM's 404s,
// checked in ARM's order: SubscriptionNotFound for an unknown subscription,
// ResourceGroupNotFound for an unknown resource group (the seed's, or one that
// holds a VM), then for the VM itself ResourceNotFound (a standalone VM),
// ParentResourceNotFound (an instance of a scale set that does not exist: ARM
// answers so for a nested resource whose parent is gone, and
// cloud-provider-azure names the code for a deleted scale set) or NotFound (a
// missing instance of a known scale set, as Compute answers).
func (s *Server) getVM(w http.ResponseWriter, path string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	sub, rg, name := parts[1], parts[3], parts[len(parts)-1]
	s.mu.Lock()
	subKnown, rgKnown := s.knownScope(sub, rg)
	exists := s.vms[vmKey(path)]
	setKnown := s.scaleSets[scaleSetOf(vmKey(path))]
	s.mu.Unlock()
	switch {
	case !subKnown:
		writeError(w, http.StatusNotFound, "SubscriptionNotFound", "The subscription '"+sub+"' could not be found.")
	case !rgKnown:
		writeError(w, http.StatusNotFound, "ResourceGroupNotFound", "Resource group '"+rg+"' could not be found.")
	case !exists && setKnown:
		writeError(w, http.StatusNotFound, "NotFound", "The entity was not found in this Azure location.")
	case !exists && scaleSetOf(vmKey(path)) != "":
		writeError(w, http.StatusNotFound, "ParentResourceNotFound", "Can not perform requested operation on nested resource. Parent resource '"+
			parts[7]+"' not found.")
	case !exists:
		writeError(w, http.StatusNotFound, "ResourceNotFound", "The Resource '"+strings.Join(parts[4:8], "/")+"' under resource group '"+rg+
			"' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix")
	default:
		writeJSON(w, http.StatusOK, map[string]any{
			"id":       path,
			"name":     name,
			"location": s.seed.Location,
			"properties": map[string]any{
				"provisioningState": "Succeeded",
			},
		})
	}
}

// knownScope reports whether the subscription, and the resource group in it,
// exist: the seed's, or those that ever held a VM (a resource group outlives
// the VMs and scale sets deleted from it). Call with s.mu held.
func (s *Server) knownScope(sub, rg string) (subKnown, rgKnown bool) {
	if strings.EqualFold(sub, s.seed.Subscription) {
		subKnown, rgKnown = true, strings.EqualFold(rg, s.seed.ResourceGroup)
	}
	prefix := vmKey("/subscriptions/" + sub + "/")
	group := vmKey("/subscriptions/" + sub + "/resourceGroups/" + rg + "/")
	for g := range s.groups {
		subKnown = subKnown || strings.HasPrefix(g, prefix)
		rgKnown = rgKnown || g == group
	}
	return subKnown, rgKnown
}

// groupOf returns the lookup key of a VM's resource group
// ("/subscriptions/<s>/resourcegroups/<g>/"), or "".
func groupOf(key string) string {
	i := strings.Index(key, "/providers/")
	if i < 0 {
		return ""
	}
	return key[:i+1]
}

// scaleSetOf returns the lookup key of a VMSS instance's scale set, or "".
func scaleSetOf(key string) string {
	i := strings.LastIndex(key, "/virtualmachines/")
	if i < 0 || !strings.Contains(key[:i], "/virtualmachinescalesets/") {
		return ""
	}
	return key[:i]
}

// addVM records a VM and its scale set (which outlives its instances). Call
// with s.mu held.
func (s *Server) addVM(id string) {
	k := vmKey(id)
	s.vms[k] = true
	if set := scaleSetOf(k); set != "" {
		s.scaleSets[set] = true
	}
	if g := groupOf(k); g != "" {
		s.groups[g] = true
	}
}

// AddVM adds a VM (by resource ID or providerID).
func (s *Server) AddVM(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addVM(id)
}
