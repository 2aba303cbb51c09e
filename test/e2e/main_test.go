// Package e2e runs nodeguard's binary against the full local cluster
// (kube-apiserver, kube-controller-manager, kube-scheduler, kwok) and the ARM
// emulator, and checks what a user relies on when a node is deleted.
package e2e

import (
	"path/filepath"
	"testing"

	"github.com/nodeguard/nodeguard/test/harness"
	ngwebhook "github.com/nodeguard/nodeguard/webhook"
)

var env *harness.Env

func TestMain(m *testing.M) {
	harness.Main(m, harness.Options{
		Cluster:          true,
		WebhookManifests: []string{filepath.Join(harness.RepoRoot(), "manifests", "webhook")},
		// The tests create their budgets before they start nodeguard.
		WithoutWebhooks: []string{ngwebhook.BudgetWebhookName},
		// What the install guards is guarded: nodeguard runs as its
		// ServiceAccount (startNodeguard), Karpenter as its own.
		InstallPolicies: true,
	}, &env)
}
