package drain

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// Timeout is the node's drain timeout: its annotation nodeguard.io/drain-timeout
// if that is a duration, else global (--drain-timeout). source says which; 0
// means no deadline. A bad annotation is returned as err, with global's
// timeout: the drain ignores it.
func Timeout(node *corev1.Node, global time.Duration) (timeout time.Duration, source string, err error) {
	v, ok := node.Annotations[ngv1alpha1.DrainTimeoutAnnotation]
	if !ok {
		return global, "--drain-timeout", nil
	}
	d, perr := time.ParseDuration(v)
	if perr != nil || d < 0 {
		return global, "--drain-timeout", fmt.Errorf("ignoring annotation %s=%q: not a duration such as 30m", ngv1alpha1.DrainTimeoutAnnotation, v)
	}
	return d, "annotation " + ngv1alpha1.DrainTimeoutAnnotation, nil
}
