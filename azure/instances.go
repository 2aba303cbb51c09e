package azure

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/nodeguard/nodeguard/azure/armclient"
)

// InstanceExists asks ARM whether the node's VM (standalone or VMSS
// instance, from its providerID) still exists: what cloud-provider-azure's
// node lifecycle controller asks before it deletes a NotReady node. A node
// whose providerID names no Azure VM (none yet, another cloud, kwok) is
// never reported gone: nothing is asked.
func (m *Manager) InstanceExists(ctx context.Context, node *corev1.Node) (bool, error) {
	id, err := armclient.VMResourceID(node.Spec.ProviderID)
	if err != nil {
		return true, nil
	}
	return m.client.VMExists(ctx, id)
}
