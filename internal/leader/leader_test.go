package leader

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestHolderChanged(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "nodeguard-leader"}
	lease := func(name, holder string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if holder != "" {
			l.Spec.HolderIdentity = ptr.To(holder)
		}
		return l
	}
	tests := []struct {
		name     string
		old, new *coordinationv1.Lease
		want     bool
	}{
		{"renewal by the same holder", lease(key.Name, "a"), lease(key.Name, "a"), false},
		{"another replica takes over", lease(key.Name, "a"), lease(key.Name, "b"), true},
		{"released on shutdown", lease(key.Name, "a"), lease(key.Name, ""), false},
		{"acquired after release", lease(key.Name, ""), lease(key.Name, "b"), true},
		{"another Lease", lease("other", "a"), lease("other", "b"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HolderChanged(key, tt.old, tt.new); got != tt.want {
				t.Errorf("HolderChanged = %v, want %v", got, tt.want)
			}
		})
	}
}
