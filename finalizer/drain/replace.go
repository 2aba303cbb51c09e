package drain

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// The rules of "replacement first": when a PDB is blocked by design, a
// Deployment may be restarted (as kubectl rollout restart does) so that its
// controller starts new pods elsewhere before it stops the old ones. These
// functions decide; package finalizer acts.

// BlockedPDBPolicy is what a drain does about pods under a PDB that is
// blocked by design.
type BlockedPDBPolicy string

const (
	// BlockedPDBReplace restarts the pods' Deployment when its rolling update
	// surges and cannot take the PDB below its desired healthy count.
	BlockedPDBReplace BlockedPDBPolicy = ngv1alpha1.BlockedPDBPolicyReplace
	// BlockedPDBWait waits for the PDB to allow a disruption.
	BlockedPDBWait BlockedPDBPolicy = ngv1alpha1.BlockedPDBPolicyWait
)

// ParseBlockedPDBPolicy checks a policy value.
func ParseBlockedPDBPolicy(v string) (BlockedPDBPolicy, error) {
	switch p := BlockedPDBPolicy(v); p {
	case BlockedPDBReplace, BlockedPDBWait:
		return p, nil
	}
	return "", fmt.Errorf("%q is neither %q nor %q", v, BlockedPDBReplace, BlockedPDBWait)
}

// PolicyFor resolves the policy for a Deployment's pods under a PDB: the
// annotation nodeguard.io/blocked-pdb-policy on the Deployment, else on the
// PDB, else the global one. source says where it came from. An invalid
// annotation is an error; the caller waits.
func PolicyFor(d *appsv1.Deployment, pdb *policyv1.PodDisruptionBudget, global BlockedPDBPolicy) (policy BlockedPDBPolicy, source string, err error) {
	for _, o := range []struct {
		annotations map[string]string
		what        string
	}{
		{d.Annotations, fmt.Sprintf("annotation on Deployment %s/%s", d.Namespace, d.Name)},
		{pdb.Annotations, fmt.Sprintf("annotation on PDB %s/%s", pdb.Namespace, pdb.Name)},
	} {
		if v, ok := o.annotations[ngv1alpha1.BlockedPDBPolicyAnnotation]; ok {
			p, err := ParseBlockedPDBPolicy(v)
			if err != nil {
				return BlockedPDBWait, o.what, fmt.Errorf("%s %s: %w", o.what, ngv1alpha1.BlockedPDBPolicyAnnotation, err)
			}
			return p, o.what, nil
		}
	}
	if global == "" {
		global = BlockedPDBReplace
	}
	return global, "--blocked-pdb-policy", nil
}

// defaultRollingUpdate is what the API server sets when a Deployment leaves
// maxSurge or maxUnavailable out.
var defaultRollingUpdate = intstr.FromString("25%")

// Fenceposts resolves a Deployment's maxSurge and maxUnavailable for its
// replica count exactly as the Deployment controller does
// (deploymentutil.ResolveFenceposts): surge rounds up, unavailable rounds
// down, and when both come to 0, unavailable is 1.
func Fenceposts(d *appsv1.Deployment) (surge, unavailable int32) {
	replicas := int(ptr.Deref(d.Spec.Replicas, 1))
	maxSurge, maxUnavailable := defaultRollingUpdate, defaultRollingUpdate
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		maxSurge = ptr.Deref(ru.MaxSurge, defaultRollingUpdate)
		maxUnavailable = ptr.Deref(ru.MaxUnavailable, defaultRollingUpdate)
	}
	s, err := intstr.GetScaledValueFromIntOrPercent(&maxSurge, replicas, true)
	if err != nil {
		s = 0
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(&maxUnavailable, replicas, false)
	if err != nil {
		u = replicas
	}
	if s == 0 && u == 0 {
		u = 1
	}
	return int32(s), int32(u)
}

// CanReplace decides whether restarting the Deployment keeps the PDB: its
// rolling update must surge (maxSurge > 0, so new pods start before old ones
// stop), and may stop at most maxUnavailable pods before their replacements
// are Ready, so healthy - maxUnavailable - alsoUnavailable must stay at or
// above desired (for a PDB over one Deployment, all healthy: replicas -
// maxUnavailable >= desiredHealthy). alsoUnavailable is what other
// Deployments' rollouts under the same PDB may take down meanwhile. When it
// may not, why says so and what the user can do.
func CanReplace(d *appsv1.Deployment, healthy, desired, alsoUnavailable int32) (ok bool, why string) {
	name := d.Namespace + "/" + d.Name
	replicas := ptr.Deref(d.Spec.Replicas, 1)
	switch {
	case d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType:
		return false, fmt.Sprintf("Deployment %s uses the Recreate strategy, which stops every pod before starting new ones; use RollingUpdate with maxSurge >= 1, scale it up or relax the PDB", name)
	case d.Spec.Paused:
		return false, fmt.Sprintf("Deployment %s is paused, so a restart would not roll out; resume it", name)
	case replicas == 0:
		return false, fmt.Sprintf("Deployment %s has 0 replicas, so it starts no replacement", name)
	}
	surge, unavailable := Fenceposts(d)
	if surge == 0 {
		return false, fmt.Sprintf("Deployment %s has maxSurge 0 (%s of %d replicas), so its controller stops a pod before starting its replacement; set maxSurge >= 1, scale it up or relax the PDB",
			name, describeSurge(d), replicas)
	}
	if left := healthy - unavailable - alsoUnavailable; left < desired {
		return false, fmt.Sprintf("Deployment %s may stop %d pod(s) before their replacements are Ready (maxUnavailable %s of %d replicas), which would leave %d healthy where the PDB requires %d; set its maxUnavailable to 0, scale it up or relax the PDB",
			name, unavailable+alsoUnavailable, describeUnavailable(d), replicas, left, desired)
	}
	return true, ""
}

func describeSurge(d *appsv1.Deployment) string {
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxSurge != nil {
		return ru.MaxSurge.String()
	}
	return defaultRollingUpdate.String()
}

func describeUnavailable(d *appsv1.Deployment) string {
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		return ru.MaxUnavailable.String()
	}
	return defaultRollingUpdate.String()
}

// RolloutDone reports whether the Deployment's controller has rolled out its
// current template to every replica, all available, none left over.
func RolloutDone(d *appsv1.Deployment) bool {
	replicas := ptr.Deref(d.Spec.Replicas, 1)
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == replicas && s.Replicas == replicas && s.AvailableReplicas == replicas
}
