package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NodeDisruptionBudget limits how many of the nodes it selects may be disrupted
// (deleted, drained or otherwise unavailable) at one time. It is to nodes what a
// PodDisruptionBudget is to pods: nodeguard admits a node deletion only when every
// budget that selects the node allows one more unavailable node.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ndb,categories=nodeguard
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Min Available",type=string,JSONPath=`.spec.minAvailable`
// +kubebuilder:printcolumn:name="Max Unavailable",type=string,JSONPath=`.spec.maxUnavailable`
// +kubebuilder:printcolumn:name="Allowed Disruptions",type=integer,JSONPath=`.status.disruptionsAllowed`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="DisruptionAllowed")].reason`
// +kubebuilder:printcolumn:name="Drain Timeout",type=string,JSONPath=`.spec.drainTimeout`
// +kubebuilder:printcolumn:name="Upgrade Fits",type=string,JSONPath=`.status.conditions[?(@.type=="UpgradeSettingsFit")].status`,priority=1
// +kubebuilder:printcolumn:name="Unhealthy Node Deletion",type=string,JSONPath=`.spec.unhealthyNodeDeletionPolicy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeDisruptionBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NodeDisruptionBudgetSpec `json:"spec"`
	// +optional
	Status NodeDisruptionBudgetStatus `json:"status,omitempty"`
}

// NodeDisruptionBudgetSpec says which nodes a budget covers and how many of them
// must stay available.
//
// +kubebuilder:validation:XValidation:rule="has(self.minAvailable) != has(self.maxUnavailable)",message="exactly one of minAvailable or maxUnavailable must be set"
type NodeDisruptionBudgetSpec struct {
	// Selector selects the nodes this budget covers. An empty selector ({})
	// selects every node, as in policy/v1 PodDisruptionBudget. Its
	// matchExpressions are checked as a PodDisruptionBudget's are: an invalid
	// requirement would otherwise select no node, and the budget guard none.
	// (The messages cannot name the requirement's index: metav1.LabelSelector
	// bounds neither its lists nor its strings, and CEL's cost estimate of a
	// message that searches them is far over the limit.)
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="every operator must be In, NotIn, Exists or DoesNotExist",fieldPath=".matchExpressions"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['In', 'NotIn']) || (has(e.values) && size(e.values) > 0))",message="values must be specified when operator is In or NotIn",fieldPath=".matchExpressions"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="values may not be specified when operator is Exists or DoesNotExist",fieldPath=".matchExpressions"
	Selector *metav1.LabelSelector `json:"selector"`

	// MinAvailable is the number of selected nodes, or the percentage of them
	// (rounded up), that must stay available. Mutually exclusive with maxUnavailable.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=8
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative integer or a percentage from 0% to 100%"
	MinAvailable *intstr.IntOrString `json:"minAvailable,omitempty"`

	// MaxUnavailable is the number of selected nodes, or the percentage of them
	// (rounded up), that may be unavailable at once. Mutually exclusive with minAvailable.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=8
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative integer or a percentage from 0% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// UnhealthyNodeDeletionPolicy says when a node the budget already counts
	// unavailable (NotReady, or carrying a signal taint) may be deleted, as
	// unhealthyPodEvictionPolicy does for PodDisruptionBudgets. AlwaysAllow (the
	// default): at once, without consuming a disruption, since deleting a node
	// that serves nothing cannot lower availability. IfHealthyBudget: only while
	// the budget has its desired available nodes.
	// +optional
	// +kubebuilder:default=AlwaysAllow
	UnhealthyNodeDeletionPolicy UnhealthyNodeDeletionPolicy `json:"unhealthyNodeDeletionPolicy,omitempty"`

	// Windows are recurring periods in which the budget is tighter: while a
	// window is active, at most its maxUnavailable nodes (default 0: none) may be
	// unavailable, whatever the budget allows otherwise.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	Windows []DisruptionWindow `json:"windows,omitempty"`

	// DrainTimeout bounds how long the drain of a selected node may wait for
	// pods that do not go by themselves (a nodeguard.io/do-not-evict pod, a
	// PodDisruptionBudget that allows nothing): once it passes, counted from
	// the node's deletion, the drain goes on as nodeguard's --drain-timeout
	// makes it. The shortest of the matching budgets' drainTimeout and the
	// node's own timeout (its nodeguard.io/drain-timeout annotation, else
	// --drain-timeout) applies. Unset: the budget sets no deadline.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+h)?([0-9]+m)?([0-9]+s)?$') && self != ''",message="must be a duration in hours, minutes and seconds, such as 30m, 90s or 1h30m"
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`
}

// UnhealthyNodeDeletionPolicy is when an unavailable node may be deleted.
// +kubebuilder:validation:Enum=AlwaysAllow;IfHealthyBudget
type UnhealthyNodeDeletionPolicy string

const (
	// AlwaysAllowUnhealthy admits the deletion of an unavailable node without
	// consuming a disruption.
	AlwaysAllowUnhealthy UnhealthyNodeDeletionPolicy = "AlwaysAllow"
	// IfHealthyBudget admits it, without consuming a disruption, only while the
	// budget has at least its desired available nodes.
	IfHealthyBudget UnhealthyNodeDeletionPolicy = "IfHealthyBudget"
)

// DisruptionWindow is a recurring period, in UTC, during which a budget allows
// fewer disruptions (none by default).
type DisruptionWindow struct {
	// Schedule is a standard five-field cron expression (minute hour day-of-month
	// month day-of-week) or a macro such as @daily, evaluated in UTC. Each time it
	// fires, the window opens for Duration.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^(@(annually|yearly|monthly|weekly|daily|midnight|hourly)|[^ ]+( +[^ ]+){4})$')",message="must be a five-field cron expression (minute hour day-of-month month day-of-week) or a macro such as @daily"
	Schedule string `json:"schedule"`

	// Duration is how long the window stays open after each time Schedule fires,
	// for example "8h" or "1h30m".
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self.matches('^(([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?$')",message="must be a duration in hours and minutes, such as 8h, 45m or 1h30m"
	Duration metav1.Duration `json:"duration"`

	// MaxUnavailable is how many selected nodes (or what percentage, rounded up)
	// may be unavailable while the window is open. Defaults to 0: no disruption.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=8
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative integer or a percentage from 0% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// NodeDisruptionBudgetStatus is the budget's view of its nodes, written by the
// budget status controller and, for disruptedNodes, by the admission webhook.
type NodeDisruptionBudgetStatus struct {
	// ObservedGeneration is the spec generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// DisruptedNodes maps the name of a node whose deletion was admitted to the
	// time of admission. The webhook adds an entry in the same conditional write
	// that checks the budget, so concurrent deletions never over-admit; the status
	// controller removes it once the node is gone, or, when a fresh read shows the
	// node not being deleted, after a timeout (a short one when the node shows no
	// disruption at all).
	// +optional
	DisruptedNodes map[string]metav1.Time `json:"disruptedNodes,omitempty"`

	// DisruptionsAllowed is how many more nodes may be disrupted now.
	// +optional
	DisruptionsAllowed int32 `json:"disruptionsAllowed"`

	// CurrentAvailable is the number of selected nodes that are available.
	// +optional
	CurrentAvailable int32 `json:"currentAvailable"`

	// DesiredAvailable is the minimum number of available nodes the budget wants.
	// +optional
	DesiredAvailable int32 `json:"desiredAvailable"`

	// ExpectedNodes is the number of nodes the selector matches.
	// +optional
	ExpectedNodes int32 `json:"expectedNodes"`

	// AgentPools are the AKS agent pools of the selected nodes (their label
	// kubernetes.azure.com/agentpool) with the upgrade settings nodeguard read
	// from Azure Resource Manager; empty without --aks-managed-cluster.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	AgentPools []AgentPoolUpgrade `json:"agentPools,omitempty"`

	// Conditions: DisruptionAllowed is True when at least one more node may be
	// disrupted; UpgradeSettingsFit says whether an upgrade of each agent
	// pool in AgentPools can keep to the budget within the pool's drain
	// timeout.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AgentPoolUpgrade is an AKS agent pool's upgrade settings as ARM reports
// them, with what they mean for the budget.
type AgentPoolUpgrade struct {
	// Name is the agent pool's name.
	Name string `json:"name"`
	// Nodes is how many of the budget's selected nodes are in the pool.
	Nodes int32 `json:"nodes"`
	// MaxSurge and MaxUnavailable as set on the pool ("" when unset: AKS's
	// defaults, 10% and 0, apply).
	// +optional
	MaxSurge string `json:"maxSurge,omitempty"`
	// +optional
	MaxUnavailable string `json:"maxUnavailable,omitempty"`
	// DrainTimeoutInMinutes is how long AKS waits for a node's evictions
	// before it gives up on the node (default 30).
	DrainTimeoutInMinutes int32 `json:"drainTimeoutInMinutes"`
	// NodeSoakDurationInMinutes is AKS's wait after each node (default 0).
	// +optional
	NodeSoakDurationInMinutes int32 `json:"nodeSoakDurationInMinutes,omitempty"`
	// UndrainableNodeBehavior is Schedule (the default: the upgrade fails on
	// a node it cannot drain) or Cordon (the node is quarantined).
	// +optional
	UndrainableNodeBehavior string `json:"undrainableNodeBehavior,omitempty"`
	// ConcurrentDrains is how many of the pool's nodes an upgrade drains at
	// once: maxSurge plus maxUnavailable, resolved against the pool's size.
	ConcurrentDrains int32 `json:"concurrentDrains"`
	// LongestWait is the longest a node's drain may wait for the budget in an
	// upgrade of the pool, as nodeguard estimates it.
	// +optional
	LongestWait *metav1.Duration `json:"longestWait,omitempty"`
}

// ConditionDisruptionAllowed is True when the budget allows one more disruption.
const ConditionDisruptionAllowed = "DisruptionAllowed"

// ConditionWindowsFire is True when every disruption window's schedule fires
// within the next five years, False (reason WindowNeverOpens) naming the
// windows that never open; absent when the budget has no window.
const ConditionWindowsFire = "WindowsFire"

// ConditionUpgradeSettingsFit is True when an AKS upgrade of every agent pool
// of the budget's nodes keeps to the budget within the pool's drain timeout,
// False (reason SurgeExceedsBudget) naming the pool and the settings that
// would fit, Unknown when the settings could not be read; absent without
// --aks-managed-cluster or when no selected node is in an agent pool.
const ConditionUpgradeSettingsFit = "UpgradeSettingsFit"

// Reasons of the UpgradeSettingsFit condition.
const (
	ReasonUpgradeSettingsFit = "SettingsFit"
	ReasonSurgeExceedsBudget = "SurgeExceedsBudget"
	ReasonSettingsUnreadable = "SettingsUnreadable"
)

// Reasons of the WindowsFire condition.
const (
	ReasonWindowsFire      = "WindowsFire"
	ReasonWindowNeverOpens = "WindowNeverOpens"
)

// Reasons of the DisruptionAllowed condition.
const (
	ReasonSufficientNodes   = "SufficientNodes"
	ReasonInsufficientNodes = "InsufficientNodes"
	ReasonWindowActive      = "DisruptionWindowActive"
	ReasonInvalidSpec       = "InvalidSpec"
	// ReasonInvalidSelector: the selector cannot be evaluated (a budget
	// stored before the CRD refused such selectors), so it selects no node.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonNoMatchingNodes: the selector is valid but matches no node, so
	// the budget guards nothing.
	ReasonNoMatchingNodes = "NoMatchingNodes"
)

// NodeDisruptionBudgetList is a list of NodeDisruptionBudgets.
//
// +kubebuilder:object:root=true
type NodeDisruptionBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeDisruptionBudget `json:"items"`
}
