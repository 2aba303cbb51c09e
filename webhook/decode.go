package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// decodeNode decodes the node of an admission request, rejecting anything that
// is not a v1 Node with a clear error.
func decodeNode(raw runtime.RawExtension, what string) (*corev1.Node, error) {
	data := bytes.TrimSpace(raw.Raw)
	if len(data) == 0 || bytes.Equal(data, []byte("null")) {
		return nil, fmt.Errorf("admission request has no %s", what)
	}
	var node corev1.Node
	if err := json.Unmarshal(data, &node); err != nil {
		return nil, fmt.Errorf("decoding %s as a Node: %w", what, err)
	}
	if node.Kind != "Node" || (node.APIVersion != "v1" && node.APIVersion != "") {
		return nil, fmt.Errorf("%s is a %s %s, not a v1 Node", what, node.APIVersion, node.Kind)
	}
	if node.Name == "" {
		return nil, fmt.Errorf("%s is a Node without a name", what)
	}
	return &node, nil
}
