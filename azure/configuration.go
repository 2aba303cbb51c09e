package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
)

// codeResourceGroupNotFound is ARM's error code for a resource group that
// does not exist; any other 404 names a missing resource in one that does.
const codeResourceGroupNotFound = "ResourceGroupNotFound"

// notFound returns the ARM error code of a 404 ("" for any other outcome).
func notFound(err error) string {
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusNotFound {
		return ""
	}
	if re.ErrorCode == "" {
		return "NotFound"
	}
	return re.ErrorCode
}

func missingLoadBalancers(resourceGroup string, names []string) string {
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf("load balancer(s) %s (--azure-load-balancers) do not exist in resource group %s",
		strings.Join(names, ", "), resourceGroup)
}

// noteUnknown records what of the configuration ARM does not know ("" when it
// knows all of it): an error in the log when that changes, and the
// configuration_ready gauge. A node found in no backend pool is told why.
// Discovery goes on: the load balancers that exist are still managed, and a
// load balancer created later is found at the next resync.
func (m *Manager) noteUnknown(ctx context.Context, unknown string) {
	m.mu.Lock()
	before := m.unknown
	m.unknown = unknown
	m.mu.Unlock()
	if unknown == "" {
		configurationReady.Set(1)
	} else {
		configurationReady.Set(0)
	}
	switch log := ctrl.LoggerFrom(ctx); {
	case unknown != "" && unknown != before:
		log.Error(errors.New(unknown), "Azure does not know what nodeguard is configured to manage: nodes in none of its backend pools have no traffic cut",
			"resourceGroup", m.cfg.ResourceGroup, "loadBalancers", m.cfg.LoadBalancers)
	case unknown == "" && before != "":
		log.Info("Azure now knows every configured load balancer", "resourceGroup", m.cfg.ResourceGroup)
	}
}

// NothingCut reports whether Azure confirmed the node Down with nothing to
// cut: it is in no backend pool of the managed load balancers, and nothing
// says it should be (see nodeState.nothingCut).
func (m *Manager) NothingCut(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[uid]
	return ok && n.confirmed && n.nothingCut()
}
