package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

func withWindows(windows ...ngv1alpha1.DisruptionWindow) builder.NDBOption {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.Windows = windows }
}

func daily(schedule string) ngv1alpha1.DisruptionWindow {
	return ngv1alpha1.DisruptionWindow{Schedule: schedule, Duration: metav1.Duration{Duration: time.Hour}}
}

// A budget whose window schedule has the cron shape the CRD checks but does
// not parse (it would refuse every delete under the budget), or whose
// selector has invalid label syntax, is refused when written, each offending
// field named; a valid one is stored.
func TestBudgetIsRefusedWhatTheDeletesCouldNotEvaluate(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t))
	tests := []struct {
		name    string
		opts    []builder.NDBOption
		wantErr []string // empty: stored
	}{
		{name: "valid windows and selector", opts: []builder.NDBOption{builder.NDBSelecting("kubernetes.azure.com/agentpool", "user"),
			withWindows(daily("0 8 * * 1-5"), daily("@daily"), daily("*/15 22-23 1,15 * SUN"))}},
		{name: "hour and minute out of range", opts: []builder.NDBOption{withWindows(daily("0 8 * * *"), daily("99 99 * * *"))},
			wantErr: []string{`spec.windows[1].schedule: Invalid value: "99 99 * * *"`, "above maximum"}},
		{name: "unknown month name", opts: []builder.NDBOption{withWindows(daily("0 8 * FOO *"))},
			wantErr: []string{`spec.windows[0].schedule: Invalid value: "0 8 * FOO *"`}},
		{name: "every bad window is named", opts: []builder.NDBOption{withWindows(daily("0 25 * * *"), daily("61 * * * *"))},
			wantErr: []string{"spec.windows[0].schedule", "spec.windows[1].schedule"}},
		{name: "label key with a space", opts: []builder.NDBOption{builder.NDBSelecting("bad key", "x")},
			wantErr: []string{`spec.selector.matchLabels: Invalid value: "bad key"`}},
		{name: "label value too long", opts: []builder.NDBOption{builder.NDBSelecting("pool", strings.Repeat("x", 64))},
			wantErr: []string{"spec.selector.matchLabels: Invalid value", "must be no more than 63 bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ndb := builder.NDB(uniqueName("validated"), append([]builder.NDBOption{builder.NDBMaxUnavailable("1")}, tt.opts...)...)
			err := env.Client.Create(context.Background(), ndb)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid budget refused: %v", err)
				}
				_ = env.Client.Delete(context.Background(), ndb)
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("creating the budget: %v, want it refused as invalid", err)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// An update is held to the same rules, and kubectl prints the field.
func TestBudgetUpdateToAnUnparsableScheduleIsRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t))
	name := uniqueName("updated")
	harness.MustCreate(t, env.Client, builder.NDB(name, builder.NDBMaxUnavailable("1"), withWindows(daily("0 8 * * *"))))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), builder.NDB(name)) })
	patch := `{"spec":{"windows":[{"schedule":"99 99 * * *","duration":"1h"}]}}`
	out, err := harness.Kubectl(env.Kubeconfig, "", "patch", "ndb", name, "--type=merge", "-p", patch)
	if err == nil || !strings.Contains(out, `spec.windows[0].schedule: Invalid value: "99 99 * * *"`) {
		t.Fatalf("kubectl patch to an unparsable schedule: %v\n%s\nwant it refused naming spec.windows[0].schedule", err, out)
	}
	if got := getBudget(t, name).Spec.Windows[0].Schedule; got != "0 8 * * *" {
		t.Errorf("schedule %q after the refused patch, want the old one", got)
	}
}

// A window of zero duration has the CRD's duration shape ("0h") and would
// never open; kubectl prints the field.
func TestBudgetWindowThatNeverOpensIsRefused(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t))
	manifest := fmt.Sprintf(`apiVersion: nodeguard.io/v1alpha1
kind: NodeDisruptionBudget
metadata: {name: %s}
spec:
  selector: {}
  maxUnavailable: 1
  windows:
  - {schedule: "@daily", duration: 0h}
`, uniqueName("never-open"))
	out, err := harness.Kubectl(env.Kubeconfig, manifest, "create", "-f", "-")
	if err == nil || !strings.Contains(out, `spec.windows[0].duration: Invalid value: "0s": must be greater than 0`) {
		t.Fatalf("kubectl create with a 0h window: %v\n%s\nwant it refused naming spec.windows[0].duration", err, out)
	}
}

// A window whose schedule parses but never fires ("0 0 31 2 *", February
// 31st) is stored as asked, with a warning kubectl prints naming it.
func TestBudgetWindowThatNeverFiresIsWarnedOf(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t))
	name := uniqueName("never-fires")
	manifest := fmt.Sprintf(`apiVersion: nodeguard.io/v1alpha1
kind: NodeDisruptionBudget
metadata: {name: %s}
spec:
  selector: {}
  maxUnavailable: 1
  windows:
  - {schedule: "@daily", duration: 1h}
  - {schedule: "0 0 31 2 *", duration: 1h}
`, name)
	out, err := harness.Kubectl(env.Kubeconfig, manifest, "create", "-f", "-")
	if err != nil {
		t.Fatalf("kubectl create: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = harness.Kubectl(env.Kubeconfig, "", "delete", "ndb", name) })
	if !strings.Contains(out, `Warning: spec.windows[1] ("0 0 31 2 *") never fires`) || strings.Contains(out, "windows[0]") {
		t.Fatalf("kubectl create printed:\n%s\nwant a warning naming spec.windows[1] only", out)
	}
}

// The webhook is called only for writes that change the spec: with nodeguard
// down, a budget's labels can still change (so can its finalizers, and its
// status), while a spec change fails closed.
func TestBudgetWebhookIsCalledForSpecChangesOnly(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	useGuards(t, startReplica(t))
	name := uniqueName("scoped-budget")
	harness.MustCreate(t, env.Client, builder.NDB(name, builder.NDBMaxUnavailable("1")))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), builder.NDB(name)) })
	useGuards(t) // nodeguard is down
	ctx := context.Background()
	merge := func(patch string) error {
		return env.Client.Patch(ctx, builder.NDB(name), client.RawPatch(types.MergePatchType, []byte(patch)))
	}
	if err := merge(`{"metadata":{"labels":{"team":"infra"}}}`); err != nil {
		t.Errorf("a label change with nodeguard down: %v, want it stored", err)
	}
	status := []byte(`{"status":{"expectedNodes":7}}`)
	if err := env.Client.Status().Patch(ctx, builder.NDB(name), client.RawPatch(types.MergePatchType, status)); err != nil {
		t.Errorf("a status write with nodeguard down: %v, want it stored (claims never wait for the budget webhook)", err)
	}
	err := merge(`{"spec":{"maxUnavailable":2}}`)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("failed calling webhook %q", "nodedisruptionbudget.nodeguard.io")) {
		t.Errorf("a spec change with nodeguard down: %v, want the webhook's failure (failurePolicy Fail)", err)
	}
}
