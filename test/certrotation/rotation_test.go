package certrotation

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	// servingSecret is the Secret the Deployment mounts (both scenarios).
	servingSecret = "nodeguard-webhook-server-cert"
	// kubeletLag is how long the stand-in kubelet takes to write a changed
	// Secret into the volume. The real one takes up to a minute or more; the
	// CA pattern does not depend on how long, so a short lag keeps the test
	// short while leaving a window the old pattern cannot survive.
	kubeletLag = 2 * time.Second
)

type object = map[string]any

// shippedCertificates returns the cert-manager objects and the webhook
// configurations of the kustomize base (manifests/default), which the chart
// renders the same (test/chart).
func shippedCertificates(t *testing.T) (certs, webhooks []object) {
	t.Helper()
	out, err := exec.Command("kubectl", "kustomize", filepath.Join(harness.RepoRoot(), "manifests", "default")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize manifests/default: %v", err)
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		switch o["kind"] {
		case "Issuer", "Certificate":
			certs = append(certs, o)
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			webhooks = append(webhooks, o)
		}
	}
	return certs, webhooks
}

// selfSignedCertificates are the manifests before cert-manager's CA pattern:
// the serving certificate is its own CA, and the webhooks get it injected.
func selfSignedCertificates(t *testing.T, namespace string, webhooks []object) []object {
	t.Helper()
	var certs []object
	for _, doc := range strings.Split(fmt.Sprintf(`apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: nodeguard-selfsigned-issuer, namespace: %[1]s}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: nodeguard-serving-cert, namespace: %[1]s}
spec:
  dnsNames: [nodeguard-webhook-service.%[1]s.svc]
  issuerRef: {kind: Issuer, name: nodeguard-selfsigned-issuer}
  secretName: %[2]s
  privateKey: {rotationPolicy: Always}
`, namespace, servingSecret), "\n---\n") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		certs = append(certs, o)
	}
	for _, wh := range webhooks {
		wh["metadata"].(map[string]any)["annotations"] = map[string]any{"cert-manager.io/inject-ca-from": namespace + "/nodeguard-serving-cert"}
	}
	return certs
}

// servingOnLoopback adds 127.0.0.1 to the serving certificate: the test's
// API server calls nodeguard by URL on the loopback address, not through the
// Service.
func servingOnLoopback(t *testing.T, certs []object) {
	t.Helper()
	for _, c := range certs {
		spec := c["spec"].(map[string]any)
		if c["kind"] == "Certificate" && spec["secretName"] == servingSecret {
			spec["ipAddresses"] = []any{"127.0.0.1"}
			return
		}
	}
	t.Fatalf("no Certificate writes %s", servingSecret)
}

// byURL points every webhook of a configuration at nodeguard on addr (the
// API server reaches no Service here), keeping everything else as shipped.
func byURL(cfg object, addr string) {
	for _, w := range cfg["webhooks"].([]any) {
		cc := w.(map[string]any)["clientConfig"].(map[string]any)
		path := cc["service"].(map[string]any)["path"].(string)
		delete(cc, "service")
		cc["url"] = "https://" + addr + path
	}
}

func apply(t *testing.T, objs ...object) {
	t.Helper()
	var docs []string
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	harness.MustKubectl(t, env.Kubeconfig, strings.Join(docs, "---\n"), "apply", "--server-side", "-f", "-")
}

// admissions counts node admissions the API server answered, and keeps the
// refusals.
type admissions struct {
	mu        sync.Mutex
	admitted  int
	refusals  []string
	deletes   int
	dryRuns   int
	createsOK int
}

func (a *admissions) record(what string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.refusals = append(a.refusals, what+": "+err.Error())
		return
	}
	a.admitted++
	switch what {
	case "delete":
		a.deletes++
	case "dry-run delete":
		a.dryRuns++
	case "create":
		a.createsOK++
	}
}

func (a *admissions) counts() (admitted, refused int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.admitted, len(a.refusals)
}

// admit keeps node admissions going until ctx ends: dry-run deletes of a
// standing node (the DELETE webhook, failurePolicy Fail), and nodes created
// (the CREATE webhook must put the finalizer on) and deleted for real, which
// nodeguard then releases. It returns a function that waits for both loops.
func admit(ctx context.Context, a *admissions, steady, prefix string) (wait func()) {
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: steady}}, client.DryRunAll)
			if ctx.Err() == nil {
				a.record("dry-run delete", err)
			}
		}
	})
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			n := builder.Node(fmt.Sprintf("%s-%d", prefix, i))
			err := env.Client.Create(ctx, n)
			if err == nil && !slices.Contains(n.Finalizers, ngv1alpha1.TerminationFinalizer) {
				err = errors.New("node created without the finalizer: the API server could not call the CREATE webhook (failurePolicy Ignore)")
			}
			if ctx.Err() != nil {
				return
			}
			a.record("create", err)
			if err != nil {
				continue
			}
			err = env.Client.Delete(ctx, n)
			if ctx.Err() == nil {
				a.record("delete", err)
			}
		}
	})
	return wg.Wait
}

// leafSerial is the serial number of the first certificate in PEM data.
func leafSerial(data []byte) string {
	block, _ := pem.Decode(data)
	if block == nil {
		return ""
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return ""
	}
	return c.SerialNumber.String()
}

// servedSerial is the serial number of the certificate nodeguard serves.
func servedSerial(addr string) string {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading which certificate is served
	if err != nil {
		return ""
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// caBundles returns the caBundle of every webhook of the configurations.
func caBundles(ctx context.Context, webhooks []object) ([][]byte, error) {
	var out [][]byte
	for _, cfg := range webhooks {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("admissionregistration.k8s.io/v1")
		u.SetKind(cfg["kind"].(string))
		if err := env.Client.Get(ctx, client.ObjectKey{Name: cfg["metadata"].(map[string]any)["name"].(string)}, u); err != nil {
			return nil, err
		}
		whs, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for _, w := range whs {
			b, _, _ := unstructured.NestedString(w.(map[string]any), "clientConfig", "caBundle")
			out = append(out, []byte(b))
		}
	}
	return out, nil
}

// oneInjectedBundle reports whether every webhook (there are several: the
// finalizer, node DELETE and NodeClaim DELETE webhooks) got the same,
// non-empty CA bundle.
func oneInjectedBundle(bundles [][]byte) bool {
	if len(bundles) < 2 || len(bundles[0]) == 0 {
		return false
	}
	for _, b := range bundles[1:] {
		if !bytes.Equal(b, bundles[0]) {
			return false
		}
	}
	return true
}

// renew asks cert-manager to renew the Certificate now, as cmctl renew does:
// the Issuing condition, set True with reason ManuallyTriggered.
func renew(t *testing.T, namespace, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("cert-manager.io/v1")
		u.SetKind("Certificate")
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		conds = slices.DeleteFunc(conds, func(c any) bool { return c.(map[string]any)["type"] == "Issuing" })
		conds = append(conds, map[string]any{
			"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
			"message":            "Certificate re-issuance manually triggered",
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
			"observedGeneration": u.GetGeneration(),
		})
		if err := unstructured.SetNestedSlice(u.Object, conds, "status", "conditions"); err != nil {
			return err
		}
		return env.Client.Status().Update(context.Background(), u)
	})
	if err != nil {
		t.Fatalf("renewing Certificate %s/%s: %v", namespace, name, err)
	}
}

// rotation is what one renewal of the serving certificate did.
type rotation struct {
	from, to          string // serial numbers
	trustChanged      bool   // the webhooks' caBundle changed
	admitted, refused int    // during the renewal, until nodeguard served the new certificate
	// issued, injected and took are when, after the renewal was asked for,
	// the Secret held the new certificate, the webhooks' caBundle changed (if
	// it did), and nodeguard served the new certificate.
	issued, injected, took time.Duration
}

// rotate installs the certificates and webhook configurations, runs
// nodeguard on the stand-in Secret volume, keeps admissions going and renews
// the serving certificate the given number of times, each time until
// nodeguard serves the new one. It returns each renewal and all admissions.
func rotate(t *testing.T, namespace string, certs, webhooks []object, renewals int) ([]rotation, *admissions) {
	t.Helper()
	ctx := context.Background()
	harness.MustCreate(t, env.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})
	apply(t, certs...)
	vol := &secretVolume{dir: t.TempDir(), key: client.ObjectKey{Namespace: namespace, Name: servingSecret}, lag: kubeletLag}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		s, err := vol.read(ctx)
		return err == nil && len(s.Data[corev1.TLSCertKey]) > 0, client.IgnoreNotFound(err)
	}, "cert-manager issues the serving certificate into %s/%s", namespace, servingSecret)
	if err := vol.mount(ctx); err != nil {
		t.Fatal(err)
	}
	volCtx, stopVolume := context.WithCancel(ctx)
	t.Cleanup(stopVolume)
	go vol.run(volCtx)

	addr := "127.0.0.1:" + strconv.Itoa(harness.FreePort(t))
	for _, cfg := range webhooks {
		byURL(cfg, addr)
	}
	apply(t, webhooks...)
	t.Cleanup(func() {
		for _, cfg := range webhooks {
			_, _ = harness.Kubectl(env.Kubeconfig, "", "delete", strings.ToLower(cfg["kind"].(string)), cfg["metadata"].(map[string]any)["name"].(string))
		}
	})
	_, port, _ := strings.Cut(addr, ":")
	ng := harness.StartNodeguard(t, env.Client, "--kubeconfig="+env.Kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--leader-elect=false", "--azure-config=", "--webhook-port="+port, "--webhook-cert-dir="+vol.dir)
	if err := ng.WaitServing(addr, time.Minute); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
		bundles, err := caBundles(ctx, webhooks)
		return err == nil && oneInjectedBundle(bundles), err
	}, "cainjector injects the CA into every webhook of both configurations")

	steady := namespace + "-steady"
	harness.MustCreate(t, env.Client, builder.Node(steady))
	harness.WaitForTerminationFinalizer(t, env.Client, steady)

	a := &admissions{}
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	wait := admit(trafficCtx, a, steady, namespace+"-churn")
	defer func() { stopTraffic(); wait() }()
	waitAdmitted(t, a, 20)
	if _, refused := a.counts(); refused > 0 {
		t.Fatalf("admissions refused before any renewal: %q", a.refusals)
	}

	serving := servingCertificateName(certs)
	var done []rotation
	for range renewals {
		r := rotation{from: servedSerial(addr)}
		before, err := caBundles(ctx, webhooks)
		if err != nil {
			t.Fatal(err)
		}
		admitted0, refused0 := a.counts()
		start := time.Now()
		renew(t, namespace, serving)
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			s, err := vol.read(ctx)
			if err != nil {
				return false, err
			}
			r.to = leafSerial(s.Data[corev1.TLSCertKey])
			return r.to != "" && r.to != r.from, nil
		}, "cert-manager renews the serving certificate (was serial %s)", r.from)
		r.issued = time.Since(start)
		harness.Eventually(t, time.Minute, func(ctx context.Context) (bool, error) {
			if r.injected == 0 {
				if now, err := caBundles(ctx, webhooks); err == nil && !bytes.Equal(now[0], before[0]) {
					r.injected = time.Since(start)
				}
			}
			return servedSerial(addr) == r.to, nil
		}, "nodeguard serves the renewed certificate %s", r.to)
		r.took = time.Since(start)
		waitAdmitted(t, a, 10) // admissions after the switch too
		admitted1, refused1 := a.counts()
		r.admitted, r.refused = admitted1-admitted0, refused1-refused0
		after, err := caBundles(ctx, webhooks)
		if err != nil {
			t.Fatal(err)
		}
		r.trustChanged = !bytes.Equal(before[0], after[0])
		t.Logf("renewal %d: serial %s -> %s; issued after %s, served after %s, webhooks' CA changed: %v (after %s); %d admissions during it, %d refused",
			len(done)+1, r.from, r.to, r.issued.Round(10*time.Millisecond), r.took.Round(10*time.Millisecond), r.trustChanged,
			r.injected.Round(10*time.Millisecond), r.admitted, r.refused)
		done = append(done, r)
	}
	stopTraffic()
	wait()
	return done, a
}

func servingCertificateName(certs []object) string {
	for _, c := range certs {
		if c["kind"] == "Certificate" && c["spec"].(map[string]any)["secretName"] == servingSecret {
			return c["metadata"].(map[string]any)["name"].(string)
		}
	}
	return ""
}

// waitAdmitted waits for n more admitted requests.
func waitAdmitted(t *testing.T, a *admissions, n int) {
	t.Helper()
	from, _ := a.counts()
	harness.Eventually(t, time.Minute, func(context.Context) (bool, error) {
		now, _ := a.counts()
		return now >= from+n, nil
	}, "%d more node admissions", n)
}

// TestServingCertificateRotationRefusesNoDelete renews the serving
// certificate of the shipped manifests (self-signed Issuer -> CA Certificate
// -> CA Issuer -> serving Certificate, the CA injected) three times under
// node deletions, dry-run and real, and node creations: the API server must
// refuse none, and the CA it trusts never changes. With cainjector as it is
// (CAInjectorMerging, cert-manager 1.19 and later) and as it was before, when
// it replaced a caBundle outright.
func TestServingCertificateRotationRefusesNoDelete(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	startCertManager(t)
	for _, merging := range []bool{true, false} {
		t.Run(fmt.Sprintf("CAInjectorMerging=%t", merging), func(t *testing.T) {
			startCAInjector(t, merging)
			certs, webhooks := shippedCertificates(t)
			namespace := fmt.Sprintf("nodeguard-merging-%t-%d", merging, nextRun())
			inNamespace(certs, webhooks, namespace)
			servingOnLoopback(t, certs)
			rotations, a := rotate(t, namespace, certs, webhooks, 3)
			for i, r := range rotations {
				if r.trustChanged {
					t.Errorf("renewal %d changed the CA the webhooks trust", i+1)
				}
				if r.admitted == 0 {
					t.Errorf("renewal %d: no admission while it was under way, so it proves nothing", i+1)
				}
			}
			t.Logf("%d renewals; %d admissions (%d deletes, %d dry-run deletes, %d creates), %d refused",
				len(rotations), a.admitted, a.deletes, a.dryRuns, a.createsOK, len(a.refusals))
			if len(a.refusals) > 0 {
				t.Errorf("%d admissions refused while the serving certificate rotated, e.g.:\n%s",
					len(a.refusals), strings.Join(a.refusals[:min(5, len(a.refusals))], "\n"))
			}
		})
	}
}

// TestSelfSignedServingCertificateRefusesDeletesOnRotation is the control:
// the same renewal with the manifests nodeguard shipped before (the serving
// certificate its own CA) and cainjector before cert-manager 1.19 replaces
// what the API server trusts before nodeguard serves the new certificate, and
// node deletes are refused. It shows that the test above can see the failure
// it guards against. (cainjector 1.19 and later adds the new CA to the
// caBundle and keeps the old one until it expires, which hides the failure.)
func TestSelfSignedServingCertificateRefusesDeletesOnRotation(t *testing.T) {
	harness.SkipWithoutEnv(t, env)
	startCertManager(t)
	startCAInjector(t, false)
	namespace := fmt.Sprintf("nodeguard-selfsigned-%d", nextRun())
	_, webhooks := shippedCertificates(t)
	certs := selfSignedCertificates(t, namespace, webhooks)
	servingOnLoopback(t, certs)
	rotations, a := rotate(t, namespace, certs, webhooks, 1)
	if !rotations[0].trustChanged {
		t.Error("renewing a self-signed serving certificate did not change the webhooks' CA")
	}
	if rotations[0].refused == 0 {
		t.Errorf("no admission refused while the self-signed serving certificate rotated (%d admitted): the rotation test cannot see the failure", rotations[0].admitted)
	}
	t.Logf("control: %d admissions refused during the renewal, e.g. %s", rotations[0].refused, firstOr(a.refusals, "none"))
}

// runs numbers the scenarios run in this process: -count=N runs them N times
// on one cluster, each in namespaces and with nodes of its own.
var runs int

func nextRun() int {
	runs++
	return runs
}

// inNamespace moves the shipped certificates into namespace, with the
// webhooks' inject-ca-from, so each subtest has its own.
func inNamespace(certs, webhooks []object, namespace string) {
	for _, c := range certs {
		c["metadata"].(map[string]any)["namespace"] = namespace
	}
	for _, wh := range webhooks {
		ann := wh["metadata"].(map[string]any)["annotations"].(map[string]any)
		from := ann["cert-manager.io/inject-ca-from"].(string)
		_, name, _ := strings.Cut(from, "/")
		ann["cert-manager.io/inject-ca-from"] = namespace + "/" + name
	}
}

func firstOr(s []string, none string) string {
	if len(s) == 0 {
		return none
	}
	return s[0]
}
