package uninstall

import (
	"flag"
	"slices"
	"strings"
	"time"
)

// Options are the flags of `nodeguard uninstall`.
type Options struct {
	Kubeconfig string
	Mutating   string
	Validating string
	Namespace  string
	Deployment string
	// PolicyBindings are the ValidatingAdmissionPolicyBindings that refuse
	// the removal of nodeguard's finalizer by anyone but nodeguard.
	PolicyBindings []string
	DrainWait      time.Duration
	StopWait       time.Duration
	// PolicyWait bounds how long a node write refused by one of
	// PolicyBindings is retried after the binding was deleted: the API
	// server stops enforcing a deleted binding a moment later.
	PolicyWait time.Duration
	Poll       time.Duration
}

// DefaultPolicyBindings are the bindings of manifests/policy and
// manifests/components/managed-nodes (the chart's, for the release name
// nodeguard).
var DefaultPolicyBindings = []string{"nodeguard-protected-fields", "nodeguard-managed-nodes"}

// BindFlags registers the flags on fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "",
		"Path of a kubeconfig; empty uses $KUBECONFIG, ~/.kube/config or the in-cluster config.")
	fs.StringVar(&o.Mutating, "mutating-webhook-configuration", "nodeguard-mutating-webhook-configuration",
		"Name of nodeguard's MutatingWebhookConfiguration, the only one deleted.")
	fs.StringVar(&o.Validating, "validating-webhook-configuration", "nodeguard-validating-webhook-configuration",
		"Name of nodeguard's ValidatingWebhookConfiguration, the only one deleted.")
	fs.StringVar(&o.Namespace, "namespace", "nodeguard-system", "Namespace of nodeguard's Deployment.")
	fs.StringVar(&o.Deployment, "deployment", "nodeguard",
		"Name of nodeguard's Deployment, scaled to 0 once drains in progress are done (otherwise it would put the finalizer back); empty leaves stopping nodeguard to you.")
	o.PolicyBindings = slices.Clone(DefaultPolicyBindings)
	fs.Func("admission-policy-bindings",
		"Comma-separated names of nodeguard's ValidatingAdmissionPolicyBindings, the only ones deleted, once nodeguard is stopped and before any finalizer is removed (they refuse that to everyone but nodeguard); empty deletes none. (default \""+strings.Join(DefaultPolicyBindings, ",")+"\")",
		func(v string) error {
			o.PolicyBindings = nil
			for _, name := range strings.Split(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					o.PolicyBindings = append(o.PolicyBindings, name)
				}
			}
			return nil
		})
	fs.DurationVar(&o.DrainWait, "drain-wait", 10*time.Minute,
		"How long to let a running nodeguard finish the drains in progress. Nodes still deleting after it are released without a complete drain, and listed.")
	fs.DurationVar(&o.StopWait, "stop-wait", 2*time.Minute,
		"How long to wait for nodeguard's pods to be gone after scaling the Deployment to 0.")
}

// Usage explains the command, for --help.
const Usage = `nodeguard uninstall removes what keeps nodes from going once nodeguard is gone:

  1. deletes nodeguard's webhook configurations (node deletes are no longer
     held to NodeDisruptionBudgets, new nodes get no finalizer, budgets are
     no longer checked when written);
  2. lets a running nodeguard finish the drains in progress (nodes deleting
     under the nodeguard.io/termination finalizer), for up to --drain-wait;
  3. scales nodeguard's Deployment to 0 and waits for its pods to go, so that
     nothing puts the finalizer back;
  4. deletes the bindings of nodeguard's ValidatingAdmissionPolicies, by name
     (--admission-policy-bindings), which refuse the removal of the finalizer
     to everyone but nodeguard;
  5. removes the finalizer, and nodeguard's draining taint and bookkeeping
     annotations, from every node that is not being deleted;
  6. releases the nodes still deleting (their drain did not finish), and lists them;
  7. lists the Azure load-balancer entries nodeguard set Down for nodes that
     are gone and would have restored to None after their grace period: no
     one restores them now (their records stay in kube-node-maintenance, so a
     reinstalled nodeguard restores them).

It deletes no CRD, NodeDisruptionBudget, Deployment or policy: remove those
afterwards (kubectl delete -k manifests/uninstall --ignore-not-found, or helm
uninstall).

Usage: nodeguard uninstall [flags]

Flags:
`
