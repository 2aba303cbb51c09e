package install

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/azure"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// debugVerbosity enables every V-level of nodeguard's log (zap's level -10).
const debugVerbosity = "--zap-log-level=10"

// secretsRuns numbers the runs of TestCredentialsNeverInDebugLogsOrEvents.
var secretsRuns int

// TestCredentialsNeverInDebugLogsOrEvents is TestLeastPrivilege's credential
// check at debug verbosity, with the client secret in $AZURE_CLIENT_SECRET and
// Entra ID refusing the first token requests (an expired secret), so that the
// credential's error path is logged and reported in events too: nodeguard buys
// a token with the secret, sets a tainted node's entries Down through ARM
// calls that carry it, and neither the secret nor any token it was issued
// appears in its log or in any event.
func TestCredentialsNeverInDebugLogsOrEvents(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	applyRBAC(t)
	secretsRuns++
	run := fmt.Sprintf("secrets%d", secretsRuns)
	node := run + "-0"
	ip := fmt.Sprintf("10.78.%d.4", secretsRuns)
	id := fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/0", subscription, resourceGroup, run)
	harness.MustCreate(t, env.Client, builder.Node(node, builder.WithProviderID(id), builder.WithInternalIP(ip)))
	seed := armemulator.SeedForNodes(subscription, resourceGroup, []armemulator.Node{{Name: node, IPs: []string{ip}, ProviderID: id}}, armemulator.Topology{})
	az := newAzure(t, seed, "nodeguard-debug-test-client-secret-93ab", true)
	const refusals = 2
	az.tokens.RefuseNext(refusals)
	ng := startNodeguard(t, az, "--metrics-bind-address=0", debugVerbosity)

	setTaints(t, node, corev1.Taint{Key: ngv1alpha1.OutOfServiceTaintKey, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	waitAdminState(t, az.emu, node, "Down")
	harness.WaitForEvent(t, env.Client, node, azure.ReasonDown)
	ng.Kill()

	if n := az.tokens.Refused(); n != refusals {
		t.Errorf("the token endpoint refused %d requests, want %d", n, refusals)
	}
	az.requireTokensUsed(t)
	logText := ng.Log()
	for _, want := range []string{"AADSTS7000222", `"level":"debug"`} {
		if !strings.Contains(logText, want) {
			t.Errorf("nodeguard's log lacks %q: the check below proves less than it should", want)
		}
	}
	requireNoCredentials(t, logText, az.credentials(nil))
}

// credentials names every credential that must stay out of logs and events:
// the client secret, each access token it bought, and others.
func (az *azureFixture) credentials(others map[string]string) map[string]string {
	creds := map[string]string{"the Azure client secret": az.secret}
	for i, tok := range az.tokens.Issued() {
		creds[fmt.Sprintf("Azure access token %d", i+1)] = tok
	}
	for what, c := range others {
		creds[what] = c
	}
	return creds
}

// requireNoCredentials fails if any credential is in the log or in an event
// (any API version, any namespace).
func requireNoCredentials(t *testing.T, logText string, creds map[string]string) {
	t.Helper()
	var events eventsv1.EventList
	if err := env.Client.List(context.Background(), &events); err != nil {
		t.Fatal(err)
	}
	for what, c := range creds {
		if c == "" {
			t.Fatalf("%s is empty: nothing to look for", what)
		}
		if strings.Contains(logText, c) {
			t.Errorf("nodeguard's log contains %s", what)
		}
		for _, e := range events.Items {
			if strings.Contains(e.Note, c) || strings.Contains(e.DeprecatedSource.Component, c) {
				t.Errorf("event %s/%s (%s) carries %s", e.Namespace, e.Name, e.Reason, what)
			}
		}
	}
	t.Logf("%d credentials looked for in %d bytes of log and %d events", len(creds), len(logText), len(events.Items))
}
