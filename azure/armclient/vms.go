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

// VMExists asks ARM whether the VM with this resource ID exists. It answers
// false only on a 404 whose error code says the VM itself is not found:
// ResourceNotFound (a standalone VM), NotFound (a VMSS instance, as Compute
// answers) or ParentResourceNotFound (a VMSS instance whose scale set is gone:
// a deleted node pool; cloud-provider-azure skips such instances by this
// code). Any other 404 is
// returned as a *VMUnknownError: ResourceGroupNotFound and
// SubscriptionNotFound (a wrong resource group or subscription in the
// providerID or the credentials' reach), InvalidResourceType, or a 404 with
// no ARM error body at all (a wrong --azure-arm-endpoint or path) say nothing
// about the VM, and reading them as "gone" would release a node undrained.
func (c *sdkClient) VMExists(ctx context.Context, id string) (bool, error) {
	resp, err := c.get(ctx, runtime.JoinPaths(c.endpoint, id)+"?api-version="+computeAPIVersion)
	if err == nil {
		defer resp.Body.Close()
		if runtime.HasStatusCode(resp, http.StatusOK) {
			return true, nil
		}
		err = runtime.NewResponseError(resp)
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusNotFound {
		return false, err
	}
	if vmNotFoundCodes[re.ErrorCode] {
		return false, nil
	}
	return false, &VMUnknownError{ID: id, Err: re}
}

// vmNotFoundCodes are the ARM error codes of a 404 that mean the VM itself
// does not exist.
var vmNotFoundCodes = map[string]bool{"ResourceNotFound": true, "NotFound": true, "ParentResourceNotFound": true}

// VMUnknownError is a 404 for a VM GET that does not say the VM is gone: the
// resource group, the subscription, the resource type or the endpoint was not
// found (ErrorCode names which; empty when the answer had no ARM error body).
type VMUnknownError struct {
	ID  string
	Err *azcore.ResponseError
}

func (e *VMUnknownError) Error() string {
	code := e.Err.ErrorCode
	if code == "" {
		code = "no ARM error body: is --azure-arm-endpoint right?"
	}
	return fmt.Sprintf("VM %s: 404 that does not say the VM is gone (%s)", e.ID, code)
}

func (e *VMUnknownError) Unwrap() error { return e.Err }

func (m metered) VMExists(ctx context.Context, id string) (ok bool, err error) {
	defer func(start time.Time) { observe(OpGetVM, start, err) }(time.Now())
	return m.c.VMExists(ctx, id)
}
