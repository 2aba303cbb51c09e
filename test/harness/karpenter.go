package harness

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Real Karpenter (hack/tools/karpenter: its controller with the kwok cloud
// provider, whose instances are Node objects that kwok plays), for the tests
// of what nodeguard does with Karpenter's disruptions.

// KarpenterCRDDir holds Karpenter's CRDs (NodePool, NodeClaim,
// KWOKNodeClass), copied out of its module by make tools.
func KarpenterCRDDir() string { return filepath.Join(BinDir(), "karpenter-crds") }

// InstallKarpenterCRDs installs (or updates) Karpenter's CRDs and waits until
// they are served.
func InstallKarpenterCRDs(t testing.TB, c client.Client) {
	t.Helper()
	if err := ApplyKarpenterCRDs(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

// ApplyKarpenterCRDs installs (or updates) Karpenter's CRDs and waits until
// they are served.
func ApplyKarpenterCRDs(ctx context.Context, c client.Client) error {
	files, err := filepath.Glob(filepath.Join(KarpenterCRDDir(), "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no Karpenter CRDs in %s (%v): run make tools", KarpenterCRDDir(), err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		err = c.Create(ctx, &crd)
		if apierrors.IsAlreadyExists(err) {
			var have apiextensionsv1.CustomResourceDefinition
			if err = c.Get(ctx, client.ObjectKey{Name: crd.Name}, &have); err == nil {
				crd.ResourceVersion = have.ResourceVersion
				err = c.Update(ctx, &crd)
			}
		}
		if err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.Name, err)
		}
		if err := WaitForCRDEstablished(ctx, c, crd.Name); err != nil {
			return err
		}
	}
	return nil
}

// WaitForCRDEstablished waits up to a minute until the CRD named name is
// established (its kind served). It reads the condition itself: kubectl wait
// fails at once on a CRD whose status has no conditions yet.
func WaitForCRDEstablished(ctx context.Context, c client.Client, name string) error {
	err := PollEvery(ctx, 100*time.Millisecond, time.Minute, func(ctx context.Context) (bool, error) {
		var got apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
			return false, err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s is not established: %w", name, err)
	}
	return nil
}

// Karpenter runs as this ServiceAccount, under the rules of its chart
// (testdata/karpenter-rbac.yaml): not the kube-system/karpenter its chart
// installs by default, so that nothing of nodeguard's may know Karpenter by
// its name.
const (
	KarpenterNamespace = "karpenter-ns"
	KarpenterUser      = "system:serviceaccount:" + KarpenterNamespace + ":karpenter-custom"
)

//go:embed testdata/karpenter-rbac.yaml
var karpenterRBAC string

// KarpenterKubeconfig applies Karpenter's RBAC (testdata/karpenter-rbac.yaml)
// through kubeconfig (an admin one, the cluster's or an APIProxy's) and
// writes to path a copy of it that acts as Karpenter's ServiceAccount
// (KarpenterUser, with its groups).
func KarpenterKubeconfig(kubeconfig, path string) error {
	if out, err := Kubectl(kubeconfig, karpenterRBAC, "apply", "--server-side", "--field-manager=nodeguard-harness", "-f", "-"); err != nil {
		return fmt.Errorf("applying Karpenter's RBAC: %v\n%s", err, out)
	}
	return WriteImpersonatingKubeconfig(kubeconfig, path, KarpenterUser)
}

// StartKarpenter runs Karpenter's controller (kwok cloud provider) against
// the cluster of kubeconfig (an admin one) until the test ends, as its
// ServiceAccount KarpenterUser with its chart's RBAC (KarpenterKubeconfig),
// with Karpenter's own settings (environment variables) plus env. If the
// test failed, its whole log is kept (keptLogsDir) and its tail logged.
func StartKarpenter(t testing.TB, kubeconfig string, env ...string) *Nodeguard {
	t.Helper()
	dir := t.TempDir()
	asKarpenter := filepath.Join(dir, "karpenter.kubeconfig")
	if err := KarpenterKubeconfig(kubeconfig, asKarpenter); err != nil {
		t.Fatal(err)
	}
	env = append([]string{"SYSTEM_NAMESPACE=" + KarpenterNamespace}, env...)
	p, err := StartKarpenterProcess(asKarpenter, filepath.Join(dir, "karpenter.log"), env...)
	if err != nil {
		t.Fatalf("starting Karpenter: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil && t.Failed() {
			t.Logf("Karpenter: %v", err)
		}
		if t.Failed() {
			t.Logf("Karpenter log (tail; whole log in %s):\n%s", keepLog(t.Name()+"-karpenter", p.Log()), p.LogTail(30))
		}
	})
	return p
}

// StartKarpenterProcess starts Karpenter's controller (kwok cloud provider)
// against the cluster of kubeconfig, logging to logPath. Leader election is
// off (one replica) and its metrics and probe servers listen on free ports,
// reserved until it exits. The caller stops it.
func StartKarpenterProcess(kubeconfig, logPath string, env ...string) (*Nodeguard, error) {
	path, err := binary("karpenter-kwok")
	if err != nil {
		return nil, err
	}
	base := []string{"KUBECONFIG=" + kubeconfig, "DISABLE_LEADER_ELECTION=true"}
	var releases []func()
	for _, name := range []string{"METRICS_PORT", "HEALTH_PROBE_PORT"} {
		port, release, err := reservePort()
		if err != nil {
			return nil, err
		}
		releases = append(releases, release)
		base = append(base, fmt.Sprintf("%s=%d", name, port))
	}
	p, err := StartNodeguardProcessWithEnv(path, logPath, append(base, env...))
	if err != nil {
		for _, release := range releases {
			release()
		}
		return nil, err
	}
	go func() {
		<-p.Done()
		for _, release := range releases {
			release()
		}
	}()
	return p, nil
}
