package webhook

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Names of nodeguard's webhooks in their configurations.
const (
	FinalizerWebhookName = "finalizer.nodeguard.io"
	DeleteWebhookName    = "delete.nodeguard.io"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=list

// scoped are nodeguard's webhooks whose objectSelector must be
// --node-selector, each with what its objectSelector selects: the NodeClaim
// webhook's selects NodeClaims by their labels, which Karpenter copies onto
// their nodes.
var scoped = map[string]string{
	FinalizerWebhookName: "nodes",
	DeleteWebhookName:    "nodes",
	NodeClaimWebhookName: "NodeClaims",
}

// ScopeMismatch is one of nodeguard's installed webhooks whose objectSelector
// does not select the nodes nodeguard manages.
type ScopeMismatch struct {
	// Config is the webhook configuration holding the webhook.
	Config  client.Object
	Webhook string
	// Selector is the webhook's objectSelector ("" for every node).
	Selector string
	Message  string
}

// CheckScope compares the objectSelector of nodeguard's installed webhooks
// (finalizer, DELETE, NodeClaim), wherever they are configured, with the
// nodes nodeguard manages. A webhook covering more nodes makes deleting
// unmanaged nodes (or their NodeClaims) depend on nodeguard being up; one
// covering fewer leaves managed nodes unguarded.
func CheckScope(ctx context.Context, reader client.Reader, managed labels.Selector) ([]ScopeMismatch, error) {
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := reader.List(ctx, &validating); err != nil {
		return nil, fmt.Errorf("listing validating webhook configurations: %w", err)
	}
	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	if err := reader.List(ctx, &mutating); err != nil {
		return nil, fmt.Errorf("listing mutating webhook configurations: %w", err)
	}
	var out []ScopeMismatch
	check := func(cfg client.Object, name string, sel *metav1.LabelSelector) {
		if m, ok := scopeMismatch(cfg, name, sel, managed); ok {
			out = append(out, m)
		}
	}
	for i := range validating.Items {
		for _, w := range validating.Items[i].Webhooks {
			check(&validating.Items[i], w.Name, w.ObjectSelector)
		}
	}
	for i := range mutating.Items {
		for _, w := range mutating.Items[i].Webhooks {
			check(&mutating.Items[i], w.Name, w.ObjectSelector)
		}
	}
	return out, nil
}

func scopeMismatch(cfg client.Object, name string, sel *metav1.LabelSelector, managed labels.Selector) (ScopeMismatch, bool) {
	objects, ok := scoped[name]
	if !ok {
		return ScopeMismatch{}, false
	}
	covered := labels.Everything()
	if sel != nil {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return ScopeMismatch{Config: cfg, Webhook: name, Message: fmt.Sprintf(
				"webhook %s in %s has an invalid objectSelector: %v", name, cfg.GetName(), err)}, true
		}
		covered = s
	}
	// Both render their requirements sorted by key, values sorted: equal
	// strings select the same nodes.
	if covered.String() == managed.String() {
		return ScopeMismatch{}, false
	}
	return ScopeMismatch{Config: cfg, Webhook: name, Selector: covered.String(), Message: fmt.Sprintf(
		"webhook %s in %s is called for the %s %s while nodeguard manages the nodes %s (--node-selector): "+
			"set its objectSelector to the same selector (Helm: nodeguard.managedNodes sets them all)",
		name, cfg.GetName(), objects, describeSelector(covered), describeSelector(managed))}, true
}

func describeSelector(s labels.Selector) string {
	if s.Empty() {
		return "(all)"
	}
	return fmt.Sprintf("%q", s.String())
}

// eventNoteLimit is the longest note events.k8s.io/v1 accepts.
const eventNoteLimit = 1024

// ScopeCheck reports, once at start-up, each of nodeguard's webhooks whose
// objectSelector differs from --node-selector: an error log, a Warning event
// WebhookScopeMismatch on its configuration, and the gauge
// nodeguard_webhook_scope_mismatch. It never blocks start-up.
type ScopeCheck struct {
	Reader   client.Reader
	Managed  labels.Selector
	Recorder events.EventRecorder
}

// Start implements manager.Runnable.
func (c *ScopeCheck) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("webhook-scope")
	mismatches, err := CheckScope(ctx, c.Reader, c.Managed)
	if err != nil {
		log.Error(err, "Checking the webhooks' objectSelector against --node-selector")
		return nil
	}
	scopeMismatches.Reset()
	// One event per configuration: events of one reason about one object
	// join one series, which keeps the first note only.
	var configs []client.Object
	notes := map[client.Object][]string{}
	for _, m := range mismatches {
		scopeMismatches.WithLabelValues(m.Webhook).Set(1)
		log.Error(nil, "Webhook scope differs from --node-selector", "webhook", m.Webhook,
			"configuration", m.Config.GetName(), "objectSelector", m.Selector, "nodeSelector", c.Managed.String())
		if _, seen := notes[m.Config]; !seen {
			configs = append(configs, m.Config)
		}
		notes[m.Config] = append(notes[m.Config], m.Message)
	}
	if c.Recorder != nil {
		for _, cfg := range configs {
			note := strings.Join(notes[cfg], "; ")
			if len(note) > eventNoteLimit { // the log lines above have it all
				note = note[:eventNoteLimit-3] + "..."
			}
			c.Recorder.Eventf(cfg, nil, corev1.EventTypeWarning, ReasonWebhookScopeMismatch, actionCheckScope, "%s", note)
		}
	}
	return nil
}
