package armclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
)

// computeAPIVersion is the Microsoft.Compute API version of the VM GETs.
const computeAPIVersion = "2024-07-01"

// VMResourceID returns the ARM ID of a node's VM from its spec.providerID
// (azure:///subscriptions/.../virtualMachines/<name>, a standalone VM, or
// .../virtualMachineScaleSets/<set>/virtualMachines/<instance>, a VMSS
// instance), or an error when the providerID names no Azure VM.
func VMResourceID(providerID string) (string, error) {
	id, ok := strings.CutPrefix(providerID, "azure://")
	if !ok {
		return "", fmt.Errorf("providerID %q is not an Azure one", providerID)
	}
	rid, err := arm.ParseResourceID(id)
	if err != nil {
		return "", fmt.Errorf("providerID %q: %w", providerID, err)
	}
	switch strings.ToLower(rid.ResourceType.String()) {
	case "microsoft.compute/virtualmachines", "microsoft.compute/virtualmachinescalesets/virtualmachines":
		return id, nil
	}
	return "", fmt.Errorf("providerID %q names a %s, not a VM", providerID, rid.ResourceType)
}

// VMExists asks ARM whether the VM with this resource ID exists: false only
// on 404 (ResourceNotFound, or NotFound for a VMSS instance), as
// cloud-provider-azure's node lifecycle controller decides; any other error
// is returned.
func (c *sdkClient) VMExists(ctx context.Context, id string) (bool, error) {
	req, err := runtime.NewRequest(ctx, http.MethodGet, runtime.JoinPaths(c.endpoint, id))
	if err != nil {
		return false, err
	}
	q := req.Raw().URL.Query()
	q.Set("api-version", computeAPIVersion)
	req.Raw().URL.RawQuery = q.Encode()
	req.Raw().Header["Accept"] = []string{"application/json"}
	resp, err := c.compute.Pipeline().Do(req)
	if err != nil {
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			return false, nil
		}
		return false, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case runtime.HasStatusCode(resp, http.StatusOK):
		return true, nil
	}
	return false, runtime.NewResponseError(resp)
}

func (m metered) VMExists(ctx context.Context, id string) (ok bool, err error) {
	defer func(start time.Time) { observe(OpGetVM, start, err) }(time.Now())
	return m.c.VMExists(ctx, id)
}
