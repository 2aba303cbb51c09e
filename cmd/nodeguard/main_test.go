package main_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeguard/nodeguard/test/harness"
)

var env *harness.Env

func TestMain(m *testing.M) { harness.Main(m, harness.Options{}, &env) }

// build builds the binary under test once per test run.
func build(t *testing.T) string {
	t.Helper()
	binary, err := harness.NodeguardBinary()
	if err != nil {
		t.Fatal(err)
	}
	return binary
}

func TestHelpExplainsFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	out, err := exec.Command(build(t), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, want := range []string{"NodeDisruptionBudget", "-leader-elect", "-metrics-bind-address", "-webhook-cert-dir", "-health-probe-bind-address"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %q:\n%s", want, out)
		}
	}
}

func TestInvalidFlagsFailWithAClearMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=10s"},
			"--leader-elect-renew-deadline (10s) must be shorter than --leader-elect-lease-duration (5s)"},
		{[]string{"--signal-taints=ToBeDeletedByClusterAutoscaler,bad key"}, `--signal-taints: signal taint "bad key": key`},
		{[]string{"--memory-limit-ratio=1.5"}, "--memory-limit-ratio 1.5: want 0 (off) or a fraction up to 1"},
		// With a 5 s grace, a stop that found a connection kube-apiserver
		// had opened but not used yet exited 1: the grace ran out.
		{[]string{"--graceful-shutdown-timeout=5s"}, "--graceful-shutdown-timeout (5s) must be 0 (exit at once) or at least 10s"},
	} {
		cmd := exec.Command(build(t), c.args...)
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 {
			t.Errorf("%v: exit code %d (%v), want 2", c.args, code, err)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%v: unclear error, want %q:\n%s", c.args, c.want, out)
		}
	}
}

// replica is one nodeguard process.
type replica struct {
	*harness.Nodeguard
	metrics, probe string // host:port
}

func startReplica(t *testing.T, extra ...string) *replica {
	t.Helper()
	r := &replica{metrics: freeAddr(t), probe: freeAddr(t)}
	args := append([]string{
		"--kubeconfig=" + env.Kubeconfig,
		"--metrics-bind-address=" + r.metrics, "--metrics-secure=false",
		"--health-probe-bind-address=" + r.probe,
		"--leader-election-namespace=nodeguard-system",
	}, extra...)
	r.Nodeguard = harness.StartNodeguard(t, nil, args...)
	return r
}

// metric returns the value of an unlabelled metric, or "" when absent.
func (r *replica) metric(name string) string {
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			return v
		}
	}
	return ""
}

func (r *replica) probeOK(path string) bool {
	resp, err := http.Get("http://" + r.probe + path)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (r *replica) waitLeading(t *testing.T, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, func(context.Context) (bool, error) {
		return r.metric("nodeguard_leader_is_leader") == "1", nil
	}, "replica %s leads", r.metrics)
}

// TestLeaderHandsOverAtOnceOnSIGTERM starts two replicas with a 60 s Lease: the
// standby can take over within the test's 30 s only if the leader released the
// Lease on SIGTERM. It also checks the probes and the leader metrics.
func TestLeaderHandsOverAtOnceOnSIGTERM(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	ctx := context.Background()
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodeguard-system"}})
	lease := []string{"--webhook-port=-1", "--leader-elect-lease-duration=60s", "--leader-elect-renew-deadline=40s"}

	a := startReplica(t, lease...)
	a.waitLeading(t, 30*time.Second)
	b := startReplica(t, lease...)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		return b.probeOK("/healthz") && b.probeOK("/readyz") && b.metric("nodeguard_leader_is_leader") == "0", nil
	}, "the standby is healthy, ready and not leading")

	if err := a.Stop(30 * time.Second); err != nil {
		t.Fatalf("leader did not exit cleanly on SIGTERM: %v", err)
	}
	b.waitLeading(t, 30*time.Second)
	// The counter follows the Lease's watch, which can deliver the new holder
	// a moment after the election made the standby lead.
	harness.Eventually(t, 10*time.Second, func(context.Context) (bool, error) {
		return b.metric("nodeguard_leader_changes_total") == "1", nil
	}, "the standby counted one leader change (nodeguard_leader_changes_total = %q)", b.metric("nodeguard_leader_changes_total"))
}

// TestWebhookServerReloadsRotatedCertificate replaces the serving certificate
// on disk, as cert-manager does on renewal, and expects the running server to
// present the new one without a restart.
func TestWebhookServerReloadsRotatedCertificate(t *testing.T) {
	if env == nil {
		t.Skip("needs a control plane (not with -short)")
	}
	certDir := t.TempDir()
	first := writeCert(t, certDir, "first")
	port := harness.FreePort(t)
	startReplica(t, "--leader-elect=false", fmt.Sprintf("--webhook-port=%d", port), "--webhook-cert-dir="+certDir)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		serial, err := servedSerial(addr)
		return err == nil && serial.Cmp(first) == 0, err
	}, "the webhook server presents the first certificate")

	second := writeCert(t, certDir, "second")
	harness.Eventually(t, 30*time.Second, func(context.Context) (bool, error) {
		serial, err := servedSerial(addr)
		return err == nil && serial.Cmp(second) == 0, err
	}, "the webhook server presents the rotated certificate")

	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}) //nolint:gosec // checking the server refuses old TLS
	if err == nil {
		conn.Close()
		t.Error("webhook server accepted TLS 1.1, want TLS 1.2 as the minimum")
	}
}

func servedSerial(addr string) (*big.Int, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reading the served certificate
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// writeCert writes a self-signed tls.crt/tls.key pair and returns its serial.
func writeCert(t *testing.T, dir, name string) *big.Int {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	writeAtomically(t, filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	writeAtomically(t, filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return serial
}

func writeAtomically(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string { return fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)) }
