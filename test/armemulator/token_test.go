package armemulator_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/nodeguard/nodeguard/azure/armclient"
	"github.com/nodeguard/nodeguard/azure/config"
	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/harness"
)

const (
	tenant       = "11111111-1111-1111-1111-111111111111"
	clientID     = "22222222-2222-2222-2222-222222222222"
	secret       = "armemulator-test-client-secret-7d1e"
	subscription = "sub"
	group        = "rg"
)

// TestClientSecretCredentialThroughTheFront runs nodeguard's own credential
// and ARM client (azure/config, azure/armclient) against the token endpoint
// and a Front that accepts only the tokens it issued: the client secret buys a
// token and the token an ARM call; an expired secret fails without the secret
// in the error; a Front that is down refuses connections until it is up.
func TestClientSecretCredentialThroughTheFront(t *testing.T) {
	dir := t.TempDir()
	tokens, err := armemulator.StartTokenEndpoint(tenant, clientID, secret, filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	defer tokens.Close()
	emu := armemulator.New(armemulator.SeedForNodes(subscription, group, []armemulator.Node{{Name: "n0", IPs: []string{"10.0.0.4"}}}, armemulator.Topology{}), armemulator.Options{})
	front, err := armemulator.StartFront(fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)), emu)
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	front.RequireBearer(tokens.IssuedToken)

	cfg, err := config.Options{
		ARMEndpoint: front.URL(), AuthorityHost: tokens.AuthorityHost(), TenantID: tenant, ClientID: clientID,
		SubscriptionID: subscription, ResourceGroup: group, Credential: config.CredentialClientSecret,
		Getenv: func(k string) string { return map[string]string{config.EnvClientSecret: secret}[k] },
	}.Load()
	if err != nil {
		t.Fatal(err)
	}
	transport := trusting(t, tokens.CAFile())
	client := func() armclient.Client {
		cred, err := cfg.NewCredential(azcore.ClientOptions{Transport: transport})
		if err != nil {
			t.Fatal(err)
		}
		c, err := armclient.New(armclient.Settings{SubscriptionID: subscription, Credential: cred, Cloud: cfg.Cloud,
			InsecureAllowHTTP: cfg.InsecureAllowHTTP, Transport: transport, Retry: policy.RetryOptions{MaxRetries: -1}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	getPool := func(c armclient.Client) error {
		_, err := c.GetPool(context.Background(), group, "kubernetes", "kubernetes")
		return err
	}

	if err := getPool(client()); err != nil {
		t.Fatalf("ARM call with a token bought by the client secret: %v", err)
	}
	if len(tokens.Issued()) != 1 || front.Unauthorized() != 0 {
		t.Fatalf("%d tokens issued, %d calls unauthorized; want 1 and 0", len(tokens.Issued()), front.Unauthorized())
	}

	tokens.RefuseNext(1)
	err = getPool(client())
	if err == nil || !strings.Contains(err.Error(), "AADSTS7000222") {
		t.Fatalf("with the secret expired: %v, want the endpoint's AADSTS7000222", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the credential's error carries the client secret: %v", err)
	}

	c := client()
	if err := front.Down(); err != nil {
		t.Fatal(err)
	}
	if err := getPool(c); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("with the front down: %v, want connection refused", err)
	}
	if err := front.Up(); err != nil {
		t.Fatal(err)
	}
	if err := getPool(c); err != nil {
		t.Fatalf("with the front up again: %v", err)
	}
}

// trusting is an HTTP client that trusts the PEM certificate in caFile.
func trusting(t *testing.T, caFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in " + caFile)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}
