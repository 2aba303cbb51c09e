package budget

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestHeldAt(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	lease := func(holder string, renewedAgo time.Duration, duration int32) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			RenewTime:            ptr.To(metav1.NewMicroTime(now.Add(-renewedAgo))),
			LeaseDurationSeconds: ptr.To(duration),
		}}
	}
	tests := []struct {
		name       string
		lease      *coordinationv1.Lease
		wantHolder string
		wantUntil  time.Time
	}{
		{name: "no lease", lease: nil},
		{name: "no holder", lease: &coordinationv1.Lease{}},
		{name: "renewed within its duration", lease: lease("upgrade-bot", 30*time.Second, 60), wantHolder: "upgrade-bot", wantUntil: now.Add(33 * time.Second)},
		{name: "inside the 3s skew allowance", lease: lease("upgrade-bot", 62*time.Second, 60), wantHolder: "upgrade-bot", wantUntil: now.Add(time.Second)},
		{name: "expired", lease: lease("upgrade-bot", 64*time.Second, 60)},
		{name: "released with duration 0", lease: lease("upgrade-bot", 0, 0)},
		{name: "administrator's hold never expires", lease: lease("kubeadm-admin", 48*time.Hour, 60), wantHolder: "kubeadm-admin"},
		{name: "administrator's hold without duration", lease: lease("kubeadm", 0, 0), wantHolder: "kubeadm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hold := HeldAt(tt.lease, now)
			switch {
			case tt.wantHolder == "" && hold != nil:
				t.Fatalf("got %v, want not held", hold)
			case tt.wantHolder != "" && hold == nil:
				t.Fatalf("not held, want held by %s", tt.wantHolder)
			case hold != nil && (hold.Holder != tt.wantHolder || !hold.Until.Equal(tt.wantUntil)):
				t.Fatalf("got %s until %v, want %s until %v", hold.Holder, hold.Until, tt.wantHolder, tt.wantUntil)
			}
		})
	}
}
