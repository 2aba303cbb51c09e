package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Well-known names nodeguard puts on or reads from core objects. They are API:
// users and other tools rely on them, so they never change.
const (
	// TerminationFinalizer holds a node whose deletion nodeguard admitted until
	// its traffic is cut and its pods are drained.
	TerminationFinalizer = "nodeguard.io/termination"

	// DrainingTaintKey (value "true", effect NoSchedule) marks a node nodeguard
	// is draining. It is never the out-of-service taint, which means a
	// non-graceful shutdown.
	DrainingTaintKey   = "nodeguard.io/draining"
	DrainingTaintValue = "true"

	// FinalizerAddedAtAnnotation records when nodeguard added its finalizer to an
	// existing node (RFC 3339). A delete in flight while the finalizer was added
	// was decided by the API server without it: for a few seconds after this
	// time, deletes are denied with "retry", so that only a fresh delete, which
	// sees the finalizer, goes ahead.
	FinalizerAddedAtAnnotation = "nodeguard.io/finalizer-added-at"

	// DrainTimeoutAnnotation on a node (a duration such as "30m") overrides
	// nodeguard's --drain-timeout for that node.
	DrainTimeoutAnnotation = "nodeguard.io/drain-timeout"

	// DrainedAtAnnotation recorded (RFC 3339) when a terminating node's drain
	// finished, on a node whose release waits for its VolumeAttachments (it
	// dates that wait's timeout), before the Drained condition did: nodeguard
	// reads it on nodes that an earlier version drained, and writes it no more.
	DrainedAtAnnotation = "nodeguard.io/drained-at"
	// TrafficCutAtAnnotation recorded when the traffic cut ended, before the
	// TrafficCut condition did: nodeguard reads it on nodes that an earlier
	// version began to terminate, and writes it no more.
	TrafficCutAtAnnotation = "nodeguard.io/traffic-cut-at"

	// AdminStateDownAnnotation (RFC 3339 time) marks a node whose
	// load-balancer entries nodeguard asked to be Down. nodeguard restores None
	// only on nodes carrying it, and removes it once Azure confirmed None.
	// Removing it by hand tells nodeguard to leave the node's entries alone
	// once its signals are gone.
	AdminStateDownAnnotation = "nodeguard.io/admin-state-down"

	// SpotEventHandledAnnotation (RFC 3339 time) records the creation time of
	// the newest PreemptScheduled event nodeguard turned into the
	// spot-eviction taint. Events created at or before it are never acted on
	// again, so a taint an operator removed stays removed across restarts.
	SpotEventHandledAnnotation = "nodeguard.io/spot-eviction-event-at"

	// TerminatingCondition is the node condition nodeguard writes while it
	// terminates a node: its reason is the phase, its message what the phase
	// waits for.
	TerminatingCondition corev1.NodeConditionType = "nodeguard.io/Terminating"

	// TrafficCutCondition is the node condition that says how the traffic
	// cut before a node's drain ended: True once Azure confirmed AdminState
	// Down on every entry, False with why when it was not cut. It is the
	// termination's durable record of the cut (TrafficCutEnded).
	TrafficCutCondition corev1.NodeConditionType = "nodeguard.io/TrafficCut"
	// TrafficCutReasonNoPool (TrafficCut False): the node is in no backend
	// pool, so there was nothing to cut.
	TrafficCutReasonNoPool = "NotInAnyBackendPool"

	// DoNotEvictAnnotation ("true") on a pod makes the drain wait for the pod to
	// go on its own instead of evicting it.
	DoNotEvictAnnotation = "nodeguard.io/do-not-evict"

	// BlockedPDBPolicyAnnotation on a Deployment or a PodDisruptionBudget
	// ("replace" or "wait") overrides --blocked-pdb-policy for the pods under
	// it; the Deployment's wins over the PDB's.
	BlockedPDBPolicyAnnotation = "nodeguard.io/blocked-pdb-policy"
	BlockedPDBPolicyReplace    = "replace"
	BlockedPDBPolicyWait       = "wait"

	// RestartedAtAnnotation (RFC 3339 time) on a Deployment's pod template is
	// nodeguard's rollout restart, the same mechanism as kubectl rollout
	// restart: the Deployment controller starts new pods elsewhere before it
	// stops the old ones on a draining node. The time also says which drains
	// the restart serves: those that began (cordon) before it.
	RestartedAtAnnotation = "nodeguard.io/restartedAt"
)

// The default signal taints (DefaultSignalTaints): while a node carries one,
// its load-balancer traffic is cut (AdminState Down) and it counts as
// unavailable for NodeDisruptionBudgets.
const (
	OutOfServiceTaintKey  = "node.kubernetes.io/out-of-service"
	CloudShutdownTaintKey = "node.cloudprovider.kubernetes.io/shutdown"
	// SpotEvictionTaintKey counts only with the value SpotEvictionTaintValue.
	SpotEvictionTaintKey   = "cloudprovider.azure.microsoft.com/draining"
	SpotEvictionTaintValue = "spot-eviction"
	// ClusterAutoscalerTaintKey is cluster-autoscaler's scale-down taint.
	ClusterAutoscalerTaintKey = "ToBeDeletedByClusterAutoscaler"
	// KarpenterDisruptedTaintKey is Karpenter's (and AKS node
	// auto-provisioning's) disruption taint.
	KarpenterDisruptedTaintKey = "karpenter.sh/disrupted"
)

// SpotPriorityLabel = SpotPriorityValue marks an AKS spot node (its agent
// pool's scaleSetPriority): the only nodes Azure preempts, so the only ones a
// PreemptScheduled notice can be about.
const (
	SpotPriorityLabel = "kubernetes.azure.com/scalesetpriority"
	SpotPriorityValue = "spot"
)

// KarpenterTerminationFinalizer is Karpenter's (and AKS node
// auto-provisioning's) Node finalizer: Karpenter drains the node and deletes
// its instance itself.
const KarpenterTerminationFinalizer = "karpenter.sh/termination"

// The mark nodeguard leaves on a node whose NodeClaim DELETE it denied: 30 s
// after the first denial, nodeguard removes Karpenter's disrupted taint (and
// the mark), so that a node Karpenter cannot remove serves again.
const (
	// NodeClaimDeleteDeniedAtAnnotation (RFC 3339 time): the first denial.
	NodeClaimDeleteDeniedAtAnnotation = "nodeguard.io/nodeclaim-delete-denied-at"
	// NodeClaimDeleteDeniedByAnnotation: what denied it, such as
	// `NodeDisruptionBudget "web"`.
	NodeClaimDeleteDeniedByAnnotation = "nodeguard.io/nodeclaim-delete-denied-by"
	// NodeClaimDeleteChargedAtAnnotation (RFC 3339 time): nodeguard charged
	// the deletion of the node's NodeClaim to its budgets. The node's own
	// deletion follows once Karpenter's NodeClaim finalizer ran; the mark
	// keeps the charge until then (the disruption is under way).
	NodeClaimDeleteChargedAtAnnotation = "nodeguard.io/nodeclaim-delete-charged-at"
)

// The marks nodeguard leaves on a node that someone else drains (kubectl
// drain, an AKS upgrade, a reboot daemon): its first eviction from the
// cordoned node was charged to the node's NodeDisruptionBudgets. While a node
// carries DrainChargedAtAnnotation it counts unavailable and its load-balancer
// entries are Down; nodeguard removes both marks, gives the disruption back
// and restores None once the node is schedulable and Ready again.
const (
	// DrainChargedAtAnnotation (RFC 3339 time): when the drain was charged.
	DrainChargedAtAnnotation = "nodeguard.io/drain-charged-at"
	// DrainedByAnnotation: who drains the node (the user of its first
	// eviction, as the API server authenticated it).
	DrainedByAnnotation = "nodeguard.io/drained-by"
	// DrainFirstEvictionAnnotation ("namespace/name"): the pod whose eviction
	// review charged the drain. An admission review is only a claim: the
	// charge is confirmed once the API server is seen carrying out an
	// eviction from the node (this pod gone or evicted, or any pod evicted
	// through the Eviction API since the charge).
	DrainFirstEvictionAnnotation = "nodeguard.io/drain-first-eviction"
	// DrainAskedAtAnnotation (RFC 3339 time): the last eviction review of an
	// unconfirmed drain (a drainer retrying behind a 429), written at most
	// every few seconds.
	DrainAskedAtAnnotation = "nodeguard.io/drain-asked-at"
	// DrainConfirmedAtAnnotation (RFC 3339 time): when nodeguard saw the drain
	// carried out. A charge neither confirmed nor asked again within
	// --unconfirmed-claim-timeout is withdrawn (a forged review, or a drainer
	// that gave up before evicting anything). A mark without
	// DrainFirstEvictionAnnotation (a drain found under way, or charged by an
	// earlier release) counts as confirmed.
	DrainConfirmedAtAnnotation = "nodeguard.io/drain-confirmed-at"
	// DrainGivenUpAtAnnotation (RFC 3339 time): nodeguard ended a charged
	// drain because its drainer said it gave up (AKS's quarantine label, or
	// its DrainInProgress set False or removed). A quarantine label already
	// there does not end a drain charged after this time; the mark goes once
	// the label does.
	DrainGivenUpAtAnnotation = "nodeguard.io/drain-given-up-at"
	// DrainConditionSeenAtAnnotation (RFC 3339 time): nodeguard saw another
	// writer's DrainInProgress=True on the cordoned node it follows; the
	// drainer removing that condition later means it gave up.
	DrainConditionSeenAtAnnotation = "nodeguard.io/drain-condition-seen-at"
)

// AKS's agent pool and upgrade labels.
const (
	// AgentPoolLabel names a node's AKS agent pool.
	AgentPoolLabel = "kubernetes.azure.com/agentpool"
	// UpgradeStatusLabel = UpgradeQuarantined: an AKS upgrade with
	// undrainableNodeBehavior Cordon could not drain the node within its
	// drain timeout, left it cordoned with its pods and went on.
	UpgradeStatusLabel = "kubernetes.azure.com/upgrade-status"
	UpgradeQuarantined = "Quarantined"
)

// cluster-autoscaler's node annotations.
const (
	// ScaleDownDisabledAnnotation = "true" keeps cluster-autoscaler from
	// scaling the node down. nodeguard sets it on the nodes of every budget
	// that allows no disruption now.
	ScaleDownDisabledAnnotation = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
	// ScaleDownDisabledByAnnotation marks ScaleDownDisabledAnnotation as set
	// by nodeguard, so that nodeguard removes only what it set and never a
	// user's.
	ScaleDownDisabledByAnnotation = "nodeguard.io/scale-down-disabled"
	// DelayDeletionAnnotation holds cluster-autoscaler's VM delete: after its
	// drain, cluster-autoscaler waits (--node-deletion-delay-timeout, 2 min by
	// default) until no delay-deletion.cluster-autoscaler.kubernetes.io/*
	// annotation is left. It reads the first time from the node as it was
	// when it picked it, so nodeguard keeps this one on every managed node and
	// removes it only from a node whose scale-down it admitted, once the
	// traffic cut is confirmed.
	DelayDeletionAnnotation = "delay-deletion.cluster-autoscaler.kubernetes.io/nodeguard"
	// DelayDeletionValue says what the hold waits for.
	DelayDeletionValue = "budget-and-traffic-cut"
	// ScaleDownClaimedAnnotation (RFC 3339 time) marks a node whose
	// scale-down nodeguard charged to its NodeDisruptionBudgets: from then on
	// cluster-autoscaler's taint counts the node unavailable (ScaleDownClaimed).
	ScaleDownClaimedAnnotation = "nodeguard.io/scale-down-claimed-at"
)

// Node maintenance Leases (KEP "Node Maintenance Lease"): a Lease named after
// the node in this namespace says who may disrupt the node.
const (
	MaintenanceLeaseNamespace = "kube-node-maintenance"
	// AdminHolderPrefix: a Lease whose holderIdentity starts with it is an
	// administrator's hold, held whatever its renew time.
	AdminHolderPrefix = "kubeadm"
)
