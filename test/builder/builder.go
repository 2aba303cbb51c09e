// Package builder makes test objects with functional options: kwok nodes,
// Deployments, PodDisruptionBudgets and NodeDisruptionBudgets.
package builder

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// KwokAnnotation marks a node as simulated by kwok.
const KwokAnnotation = "kwok.x-k8s.io/node"

// NodeOption changes a node under construction.
type NodeOption func(*corev1.Node)

// Node returns a kwok-managed node. kwok reports it Ready once it exists.
func Node(name string, opts ...NodeOption) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{corev1.LabelHostname: name, "type": "kwok"},
			Annotations: map[string]string{KwokAnnotation: "fake"},
		},
	}
	for _, opt := range opts {
		opt(n)
	}
	return n
}

// WithLabels adds labels.
func WithLabels(kv ...string) NodeOption {
	return func(n *corev1.Node) {
		for i := 0; i+1 < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}

// WithProviderID sets spec.providerID, e.g. an Azure VM resource ID.
func WithProviderID(id string) NodeOption {
	return func(n *corev1.Node) { n.Spec.ProviderID = id }
}

// WithInternalIP adds an InternalIP address (call twice for dual stack). A
// Hostname address is added too, so kwok keeps the addresses as given.
func WithInternalIP(ip string) NodeOption {
	return func(n *corev1.Node) {
		if len(n.Status.Addresses) == 0 {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
}

// WithTaints adds taints.
func WithTaints(taints ...corev1.Taint) NodeOption {
	return func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, taints...) }
}

// Ready sets the node's Ready condition, for control planes without kwok.
// The API server keeps the status a node is created with.
func Ready() NodeOption {
	return func(n *corev1.Node) {
		now := metav1.Now()
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		})
	}
}

// WithoutKubelet leaves the node out of kwok: nothing plays its kubelet, as
// on a node whose VM is gone.
func WithoutKubelet() NodeOption {
	return func(n *corev1.Node) { delete(n.Annotations, KwokAnnotation) }
}

// Unreachable sets the node's Ready condition to Unknown, as the node lifecycle
// controller does when the kubelet stops posting status.
func Unreachable() NodeOption {
	return func(n *corev1.Node) {
		now := metav1.Now()
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
			Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
			Message: "Kubelet stopped posting node status.", LastHeartbeatTime: now, LastTransitionTime: now,
		})
	}
}

// WithFinalizers adds finalizers.
func WithFinalizers(finalizers ...string) NodeOption {
	return func(n *corev1.Node) { n.Finalizers = append(n.Finalizers, finalizers...) }
}

// WorkloadOption changes a Deployment under construction.
type WorkloadOption func(*appsv1.Deployment)

// Deployment returns a Deployment of replicas pods labelled app=name that
// tolerate every taint (kwok nodes carry none by default, tests add some).
func Deployment(namespace, name string, replicas int32, opts ...WorkloadOption) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
	for _, opt := range opts {
		opt(d)
	}
	return d
}

// OnNodes pins the pods to nodes with the given label.
func OnNodes(key, value string) WorkloadOption {
	return func(d *appsv1.Deployment) {
		if d.Spec.Template.Spec.NodeSelector == nil {
			d.Spec.Template.Spec.NodeSelector = map[string]string{}
		}
		d.Spec.Template.Spec.NodeSelector[key] = value
	}
}

// WithPodAnnotations adds annotations to the pod template.
func WithPodAnnotations(kv ...string) WorkloadOption {
	return func(d *appsv1.Deployment) {
		if d.Spec.Template.Annotations == nil {
			d.Spec.Template.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Spec.Template.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// PDB returns a PodDisruptionBudget over the pods labelled app=app, with
// either maxUnavailable or minAvailable set from budget (use MaxUnavailable or
// MinAvailable).
func PDB(namespace, app string, budget func(*policyv1.PodDisruptionBudgetSpec)) *policyv1.PodDisruptionBudget {
	p := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: app},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	budget(&p.Spec)
	return p
}

// MaxUnavailable sets a PDB's maxUnavailable ("1", "25%").
func MaxUnavailable(v string) func(*policyv1.PodDisruptionBudgetSpec) {
	return func(s *policyv1.PodDisruptionBudgetSpec) { s.MaxUnavailable = ptr.To(intstr.Parse(v)) }
}

// MinAvailable sets a PDB's minAvailable ("3", "75%").
func MinAvailable(v string) func(*policyv1.PodDisruptionBudgetSpec) {
	return func(s *policyv1.PodDisruptionBudgetSpec) { s.MinAvailable = ptr.To(intstr.Parse(v)) }
}

// NDBOption changes a NodeDisruptionBudget under construction.
type NDBOption func(*ngv1alpha1.NodeDisruptionBudget)

// NDB returns a NodeDisruptionBudget selecting every node unless an option
// narrows it. Set a budget with NDBMaxUnavailable or NDBMinAvailable.
func NDB(name string, opts ...NDBOption) *ngv1alpha1.NodeDisruptionBudget {
	b := &ngv1alpha1.NodeDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       ngv1alpha1.NodeDisruptionBudgetSpec{Selector: &metav1.LabelSelector{}},
	}
	for _, opt := range opts {
		opt(b)
	}
	return b
}

// NDBSelecting selects nodes with the given labels.
func NDBSelecting(kv ...string) NDBOption {
	return func(b *ngv1alpha1.NodeDisruptionBudget) {
		labels := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			labels[kv[i]] = kv[i+1]
		}
		b.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	}
}

// NDBMaxUnavailable sets maxUnavailable ("1", "25%").
func NDBMaxUnavailable(v string) NDBOption {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.MaxUnavailable = ptr.To(intstr.Parse(v)) }
}

// NDBUnhealthyNodeDeletion sets unhealthyNodeDeletionPolicy.
func NDBUnhealthyNodeDeletion(p ngv1alpha1.UnhealthyNodeDeletionPolicy) NDBOption {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.UnhealthyNodeDeletionPolicy = p }
}

// NDBMinAvailable sets minAvailable ("3", "75%").
func NDBMinAvailable(v string) NDBOption {
	return func(b *ngv1alpha1.NodeDisruptionBudget) { b.Spec.MinAvailable = ptr.To(intstr.Parse(v)) }
}
