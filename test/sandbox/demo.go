package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	demoNamespace       = "demo"
	demoNamespaceSystem = "nodeguard-system"
	demoSubscription    = "00000000-0000-0000-0000-000000000000"
	demoResourceGroup   = "mc_nodeguard-demo_nodeguard_westeurope"
	poolLabel           = "kubernetes.azure.com/agentpool"
)

type demoNode struct{ name, pool, ip string }

// demoNodes are two AKS-style VMSS node pools of three nodes each.
var demoNodes = []demoNode{
	{"aks-system-vmss000000", "system", "10.224.0.4"},
	{"aks-system-vmss000001", "system", "10.224.0.5"},
	{"aks-system-vmss000002", "system", "10.224.0.6"},
	{"aks-user-vmss000000", "user", "10.224.0.7"},
	{"aks-user-vmss000001", "user", "10.224.0.8"},
	{"aks-user-vmss000002", "user", "10.224.0.9"},
}

// providerID is the Azure VMSS instance ID cloud-provider-azure would set.
func providerID(n demoNode, index int) string {
	return fmt.Sprintf("azure:///subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/aks-%s-vmss/virtualMachines/%d",
		demoSubscription, demoResourceGroup, n.pool, index%3)
}

// emulatorSeed is an AKS-like resource group holding the demo nodes: a public
// load balancer with a NIC-based pool and an internal one with an IP-based pool.
func emulatorSeed() armemulator.Seed {
	var nodes []armemulator.Node
	for i, n := range demoNodes {
		nodes = append(nodes, armemulator.Node{Name: n.name, IPs: []string{n.ip}, ProviderID: providerID(n, i)})
	}
	return armemulator.SeedForNodes(demoSubscription, demoResourceGroup, nodes, armemulator.Topology{NICBased: true, Internal: true})
}

// createDemoBudgets creates the demo's NodeDisruptionBudgets once nodeguard
// serves the budget webhook (failurePolicy Fail), which refuses them before.
func createDemoBudgets(ctx context.Context, env *harness.Env) error {
	for _, ndb := range []*ngv1alpha1.NodeDisruptionBudget{
		builder.NDB("system", builder.NDBSelecting(poolLabel, "system"), builder.NDBMaxUnavailable("1")),
		builder.NDB("user", builder.NDBSelecting(poolLabel, "user"), builder.NDBMinAvailable("50%")),
	} {
		var last error
		err := harness.Poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
			last = env.Client.Create(ctx, ndb)
			return last == nil || apierrors.IsAlreadyExists(last), nil
		})
		if err != nil {
			return fmt.Errorf("creating NodeDisruptionBudget %s: %w (last: %v)", ndb.Name, err, last)
		}
	}
	return nil
}

// waitGuarded waits until nodeguard's backfill has put its finalizer on every
// demo node and taken its finalizer-added-at mark off again, and has
// evaluated every budget: before, a delete is refused with "retry", after, it
// takes the guarded path.
func waitGuarded(ctx context.Context, env *harness.Env) error {
	fmt.Println("waiting for nodeguard to guard every node ...")
	var last string
	err := harness.Poll(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		var budgets ngv1alpha1.NodeDisruptionBudgetList
		if err := env.Client.List(ctx, &budgets); err != nil {
			return false, err
		}
		for _, b := range budgets.Items {
			if b.Status.ObservedGeneration < b.Generation {
				last = "NodeDisruptionBudget " + b.Name + " not evaluated"
				return false, nil
			}
		}
		var nodes corev1.NodeList
		if err := env.Client.List(ctx, &nodes); err != nil {
			return false, err
		}
		for _, n := range nodes.Items {
			_, marked := n.Annotations[ngv1alpha1.FinalizerAddedAtAnnotation]
			if marked || !slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) {
				last = "node " + n.Name + " without the finalizer"
				return false, nil
			}
		}
		return len(nodes.Items) == len(demoNodes), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for nodeguard to guard every node (last: %s): %w", last, err)
	}
	return nil
}

func createDemo(ctx context.Context, env *harness.Env) error {
	c := env.Client
	var objs []client.Object
	for _, ns := range []string{demoNamespace, demoNamespaceSystem} {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for i, n := range demoNodes {
		objs = append(objs, builder.Node(n.name,
			builder.WithLabels(poolLabel, n.pool),
			builder.WithProviderID(providerID(n, i)),
			builder.WithInternalIP(n.ip)))
	}
	objs = append(objs,
		builder.Deployment(demoNamespace, "web", 6, builder.OnNodes(poolLabel, "user")),
		builder.PDB(demoNamespace, "web", builder.MaxUnavailable("1")),
		builder.Deployment(demoNamespace, "api", 4, builder.OnNodes(poolLabel, "user")),
		builder.PDB(demoNamespace, "api", builder.MinAvailable("75%")),
		builder.Deployment(demoNamespace, "batch", 3),
	)
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
		}
	}
	fmt.Println("waiting for the demo pods to run ...")
	return harness.Poll(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(demoNamespace)); err != nil {
			return false, err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 13, nil
	})
}
