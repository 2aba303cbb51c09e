// Command kubectl-nodeguard is the kubectl plugin `kubectl nodeguard`: it
// reads the cluster (never writes it) and says why a node is still there,
// what removing nodes will run into, and what the budgets count out.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/internal/buildinfo"
	"github.com/nodeguard/nodeguard/internal/plugin"
)

func main() {
	if err := newRoot(os.Stdout).Execute(); err != nil {
		os.Exit(1)
	}
}

// flags are the options every subcommand shares.
type flags struct {
	kube      clientcmd.ConfigOverrides
	loading   *clientcmd.ClientConfigLoadingRules
	output    string
	namespace string // nodeguard's
}

func newRoot(out io.Writer) *cobra.Command {
	f := &flags{loading: clientcmd.NewDefaultClientConfigLoadingRules()}
	root := &cobra.Command{
		Use:         "kubectl-nodeguard",
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl nodeguard"},
		Short:       "See what holds a node, and what removing nodes will run into, before it starts",
		Long: "kubectl nodeguard reads the cluster and nodeguard's NodeDisruptionBudgets; it never writes.\n\n" +
			"  why NODE       why the node is still there (or what deleting it would meet)\n" +
			"  plan NODE...   a dry run of removing (or upgrading) nodes: order, blockers, lost pods, time\n" +
			"  budgets        each NodeDisruptionBudget and the nodes it counts out",
		SilenceUsage: true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetOut(out)
	pf := root.PersistentFlags()
	pf.StringVar(&f.loading.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file to use.")
	pf.StringVar(&f.kube.CurrentContext, "context", "", "The name of the kubeconfig context to use.")
	pf.StringVar(&f.namespace, "nodeguard-namespace", "nodeguard-system", "Namespace of nodeguard's Deployment, whose flags (--blocked-pdb-policy, --drain-timeout, --daemonset-pods) the answers follow.")
	pf.StringVarP(&f.output, "output", "o", "", "Output format: one of (json, yaml). Empty prints text.")
	root.AddCommand(whyCommand(f), planCommand(f), budgetsCommand(f), &cobra.Command{
		Use: "version", Short: "Print the plugin's version and revision", Args: cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), buildinfo.String()) },
	})
	return root
}

// cluster connects to the cluster the flags name.
func (f *flags) cluster(ctx context.Context) (*plugin.Cluster, string, error) {
	if f.output != "" && f.output != "json" && f.output != "yaml" {
		return nil, "", fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json, yaml", f.output)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.loading, &f.kube).ClientConfig()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := ngv1alpha1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", err
	}
	settings, from := plugin.ReadSettings(ctx, c, f.namespace)
	return &plugin.Cluster{Client: c, Settings: settings, Now: time.Now}, from, nil
}

// print writes v as the -o format asks, or as text.
func (f *flags) print(w io.Writer, v any, text func(io.Writer) error) error {
	switch f.output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "    ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return text(w)
}

func whyCommand(f *flags) *cobra.Command {
	return &cobra.Command{
		Use:   "why NODE",
		Short: "Say why a node is still there, or what deleting it would meet",
		Long: "Show the node's deletion, nodeguard's conditions on it, the NodeDisruptionBudgets and maintenance Lease that hold it,\n" +
			"what its drain meets (blocked PDBs, do-not-evict pods, pods under several PDBs, pods it loses), its drain deadline (the shortest\n" +
			"of --drain-timeout, its annotation and its budgets' drainTimeout, and which) and its last events.",
		Example: "  kubectl nodeguard why aks-user-vmss000000\n  kubectl nodeguard why aks-user-vmss000000 -o json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, from, err := f.cluster(cmd.Context())
			if err != nil {
				return err
			}
			r, err := c.Why(cmd.Context(), args[0], from)
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), r, func(w io.Writer) error { return r.Print(w, c.Now()) })
		},
	}
}

func planCommand(f *flags) *cobra.Command {
	var selector string
	o := plugin.PlanOptions{PodCycle: 30 * time.Second, MaxConcurrentDrains: plugin.DefaultMaxConcurrentDrains, ControllerQPS: 20, ReimageTime: 5 * time.Minute}
	cmd := &cobra.Command{
		Use:   "plan (NODE... | -l SELECTOR)",
		Short: "Dry-run removing (or upgrading) nodes: order, blockers, lost pods, duration",
		Long: "Plan the removal of the nodes as nodeguard would run it, without changing anything: which the NodeDisruptionBudgets admit now\n" +
			"and in what waves the rest follow, what each drain meets and why, the pods it loses, and an estimated duration from the\n" +
			"PodDisruptionBudget chains (each PDB's pods on the node in rounds of what it allows, --pod-cycle between rounds).\n" +
			"With --max-surge N it plans an upgrade: at most N nodes at once, each replaced by a new node of the same labels.\n" +
			"With --upgrade it plans an AKS upgrade of the nodes' agent pools, pool after pool, with each pool's upgrade settings as\n" +
			"nodeguard read them from Azure (status.agentPools of the budgets of its nodes; AKS's defaults, said so, without them):\n" +
			"AKS cordons the pool's concurrent drains (maxSurge + maxUnavailable; --max-surge overrides) at a time, the budgets admit\n" +
			"their drains in waves, and a wave takes its longest drain, then --reimage-time, then the pool's soak. A node whose wait\n" +
			"for the budget after its cordon, plus its drain, reaches the pool's drain timeout is flagged: AKS gives up on it.\n" +
			"Each node's drain deadline (the shortest of --drain-timeout, its annotation and its budgets' drainTimeout) is shown.",
		Example: "  kubectl nodeguard plan aks-user-vmss000000 aks-user-vmss000001\n" +
			"  kubectl nodeguard plan -l kubernetes.azure.com/agentpool=user --max-surge 1\n" +
			"  kubectl nodeguard plan -l kubernetes.azure.com/agentpool=user --upgrade --reimage-time 4m\n" +
			"  kubectl nodeguard plan -l kubernetes.azure.com/agentpool=user -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 0) == (selector == "") {
				return fmt.Errorf("name the nodes or give -l SELECTOR, not both")
			}
			if o.ReimageTime < 0 {
				return fmt.Errorf("--reimage-time %s: must not be negative", o.ReimageTime)
			}
			c, from, err := f.cluster(cmd.Context())
			if err != nil {
				return err
			}
			names := args
			if selector != "" {
				if names, err = selected(cmd.Context(), c, selector); err != nil {
					return err
				}
			}
			r, err := c.Plan(cmd.Context(), names, o, from)
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), r, r.Print)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Selector (label query) of the nodes to plan, e.g. -l key1=value1,key2=value2.")
	cmd.Flags().IntVar(&o.MaxSurge, "max-surge", 0, "Plan an upgrade that surges this many nodes: at most this many go at once, each replaced by a new node of the same labels. 0 plans a removal. With --upgrade, overrides each agent pool's concurrent drains.")
	cmd.Flags().BoolVar(&o.Upgrade, "upgrade", false, "Plan an AKS upgrade of the nodes' agent pools with each pool's upgrade settings (maxSurge, maxUnavailable, drainTimeoutInMinutes, nodeSoakDurationInMinutes) from the budgets' status.agentPools, and flag the nodes whose wait for the budget outlasts the pool's drain timeout.")
	cmd.Flags().DurationVar(&o.ReimageTime, "reimage-time", o.ReimageTime, "With --upgrade: from a node's drained until it is Ready and uncordoned again: AKS's reimage and boot.")
	cmd.Flags().DurationVar(&o.PodCycle, "pod-cycle", o.PodCycle, "From an eviction until its replacement is Ready and its PDB allows the next: the time between a PDB's rounds.")
	cmd.Flags().IntVar(&o.MaxConcurrentDrains, "max-concurrent-drains", o.MaxConcurrentDrains, "nodeguard's --max-concurrent-drains: how many nodes of a wave drain at once (not with --upgrade: AKS drains them).")
	cmd.Flags().IntVar(&o.ControllerQPS, "controller-qps", o.ControllerQPS, "kube-controller-manager's --kube-api-qps: its ReplicaSet controller writes about 4 requests per replaced pod at this pace, which bounds a drain of many PDB-protected pods. 0 leaves it out.")
	return cmd
}

// selected names the nodes a label selector selects.
func selected(ctx context.Context, c *plugin.Cluster, selector string) ([]string, error) {
	sel, err := parseSelector(selector)
	if err != nil {
		return nil, err
	}
	var list corev1.NodeList
	if err := c.Client.List(ctx, &list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, fmt.Errorf("no node matches %q", selector)
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names, nil
}

func budgetsCommand(f *flags) *cobra.Command {
	return &cobra.Command{
		Use:     "budgets",
		Short:   "List each NodeDisruptionBudget with the nodes it counts out, and who charged them",
		Example: "  kubectl nodeguard budgets\n  kubectl nodeguard budgets -o yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := f.cluster(cmd.Context())
			if err != nil {
				return err
			}
			rows, err := c.Budgets(cmd.Context())
			if err != nil {
				return err
			}
			return f.print(cmd.OutOrStdout(), rows, func(w io.Writer) error { return plugin.PrintBudgets(w, rows, c.Now()) })
		},
	}
}

func parseSelector(s string) (labels.Selector, error) {
	sel, err := labels.Parse(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("-l %q: %w", s, err)
	}
	return sel, nil
}
