package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/budget"
	"github.com/nodeguard/nodeguard/upgrade"
)

// BudgetPath serves the validating webhook for NodeDisruptionBudget writes.
const BudgetPath = "/validate-nodedisruptionbudget"

// BudgetWebhookName is the budget webhook's name in its configuration.
const BudgetWebhookName = "nodedisruptionbudget.nodeguard.io"

// The CRD's CEL rules check each field's shape; this webhook checks what CEL
// cannot: that the schedule of every window parses with the parser the
// deletes use (a "99 99 * * *" has the shape and would refuse every delete
// under the budget), and the selector's label syntax, with the validation a
// PodDisruptionBudget's selector gets. Only writes that change the spec are
// sent (a label or finalizer change needs no nodeguard), never the status
// subresource: the claims' status writes do not wait for it.
// +kubebuilder:webhook:path=/validate-nodedisruptionbudget,mutating=false,failurePolicy=fail,sideEffects=None,groups=nodeguard.io,resources=nodedisruptionbudgets,verbs=create;update,versions=v1alpha1,name=nodedisruptionbudget.nodeguard.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"spec-changed","expression":"request.operation == 'CREATE' || object.spec != oldObject.spec"}]}`

// BudgetValidator refuses a NodeDisruptionBudget whose spec nodeguard could
// not evaluate, with the offending fields named, and warns of what it admits
// but will not work as meant: a window that never opens, an AKS upgrade of an
// agent pool that the budget would hold past the pool's drain timeout.
type BudgetValidator struct {
	// Nodes lists the nodes the budget selects (the cache); with Upgrades
	// (nil: no upgrade warning) and UpgradeNodeTime it judges the upgrades.
	Nodes           client.Reader
	Upgrades        upgrade.Source
	UpgradeNodeTime time.Duration
}

// Handle implements admission.Handler.
func (v *BudgetValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		observeBudgetValidation(resultError)
		return admission.Errored(http.StatusBadRequest, fmt.Errorf(
			"unexpected operation %q: this webhook admits NodeDisruptionBudget CREATE and UPDATE only", req.Operation))
	}
	ndb, err := decodeBudget(req.Object)
	if err != nil {
		observeBudgetValidation(resultError)
		return admission.Errored(http.StatusBadRequest, err)
	}
	if errs := validateBudgetSpec(&ndb.Spec, field.NewPath("spec")); len(errs) > 0 {
		observeBudgetValidation(resultDenied)
		invalid := apierrors.NewInvalid(ngv1alpha1.GroupVersion.WithKind("NodeDisruptionBudget").GroupKind(), ndb.Name, errs)
		// The status carries the field errors: kubectl prints each of them.
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &invalid.ErrStatus}}
	}
	observeBudgetValidation(resultAllowed)
	resp := admission.Allowed("")
	for _, w := range budget.NeverFiring(ndb.Spec.Windows, time.Now()) {
		// Stored as asked (it parses), but said: kubectl prints warnings.
		resp.Warnings = append(resp.Warnings, fmt.Sprintf("spec.%s never fires: that disruption window never opens", w))
	}
	resp.Warnings = append(resp.Warnings, v.upgradeWarnings(ctx, ndb)...)
	return resp
}

// upgradeWarnings judges an AKS upgrade of each agent pool of the budget's
// nodes under the budget as written. A failure to read says nothing: the
// budget's UpgradeSettingsFit condition says it once the status is written.
func (v *BudgetValidator) upgradeWarnings(ctx context.Context, ndb *ngv1alpha1.NodeDisruptionBudget) []string {
	if v.Upgrades == nil || v.Nodes == nil {
		return nil
	}
	pools, _ := v.Upgrades.AgentPools()
	sel, err := budget.Selector(ndb)
	if len(pools) == 0 || err != nil {
		return nil
	}
	var nodes corev1.NodeList
	if err := v.Nodes.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil
	}
	selected := make([]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		selected[i] = &nodes.Items[i]
	}
	nodeTime := v.UpgradeNodeTime
	if nodeTime <= 0 {
		nodeTime = budget.DefaultUpgradeNodeTime
	}
	return budget.UpgradeWarnings(ndb, selected, pools, nodeTime)
}

// validateBudgetSpec returns what in a budget's spec nodeguard cannot
// evaluate: a window schedule the deletes' parser refuses, a window that
// never opens, and a selector a PodDisruptionBudget's validation refuses.
func validateBudgetSpec(spec *ngv1alpha1.NodeDisruptionBudgetSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if spec.Selector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(spec.Selector,
			metav1validation.LabelSelectorValidationOptions{}, path.Child("selector"))...)
	}
	for i, w := range spec.Windows {
		at := path.Child("windows").Index(i)
		if _, err := budget.ParseSchedule(w.Schedule); err != nil {
			errs = append(errs, field.Invalid(at.Child("schedule"), w.Schedule, err.Error()))
		}
		if w.Duration.Duration <= 0 {
			errs = append(errs, field.Invalid(at.Child("duration"), w.Duration.Duration.String(), "must be greater than 0: the window would never open"))
		}
	}
	return errs
}

// decodeBudget decodes the budget of an admission request, rejecting anything
// that is not a NodeDisruptionBudget with a clear error.
func decodeBudget(raw runtime.RawExtension) (*ngv1alpha1.NodeDisruptionBudget, error) {
	data := bytes.TrimSpace(raw.Raw)
	if len(data) == 0 || bytes.Equal(data, []byte("null")) {
		return nil, fmt.Errorf("admission request has no object")
	}
	var ndb ngv1alpha1.NodeDisruptionBudget
	if err := json.Unmarshal(data, &ndb); err != nil {
		return nil, fmt.Errorf("decoding object as a NodeDisruptionBudget: %w", err)
	}
	if ndb.Kind != "NodeDisruptionBudget" || ndb.APIVersion != ngv1alpha1.GroupVersion.String() {
		return nil, fmt.Errorf("object is a %s %s, not a %s NodeDisruptionBudget", ndb.APIVersion, ndb.Kind, ngv1alpha1.GroupVersion)
	}
	return &ndb, nil
}

var budgetValidations = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "nodeguard_ndb_validation_requests_total",
	Help: "NodeDisruptionBudget CREATE and UPDATE reviews by result (allowed, denied: a field nodeguard cannot evaluate, error: a malformed review).",
}, []string{labelResult})

func init() { metrics.Registry.MustRegister(budgetValidations) }

func observeBudgetValidation(result string) { budgetValidations.WithLabelValues(result).Inc() }
