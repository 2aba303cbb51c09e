package config

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"k8s.io/utils/ptr"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "azure.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

const aksFile = `{
  "cloud": "AzurePublicCloud",
  "tenantId": "tenant-1",
  "subscriptionId": "sub-1",
  "aadClientId": "msi",
  "aadClientSecret": "msi",
  "resourceGroup": "mc_rg_cluster_westeurope",
  "location": "westeurope",
  "vmType": "vmss",
  "useManagedIdentityExtension": true,
  "userAssignedIdentityID": "11111111-2222-3333-4444-555555555555",
  "loadBalancerSku": "Standard"
}`

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		file    string // content; "" means no file
		path    string // overrides the file path
		mutate  func(*Options)
		env     map[string]string
		wantErr string // substring
		check   func(t *testing.T, c *Config)
	}{{
		name:    "nothing at all disables admin state",
		path:    DefaultConfigFile + ".absent-in-tests",
		wantErr: ErrNotConfigured.Error(),
	}, {
		name:    "explicit file that cannot be read",
		path:    "/nonexistent/azure.json",
		wantErr: "reading /nonexistent/azure.json (--azure-config)",
	}, {
		name:    "bad JSON",
		file:    `{"subscriptionId": "x",`,
		wantErr: "parsing",
	}, {
		name:    "wrong type names the field",
		file:    `{"subscriptionId": ["a", "b"], "resourceGroup": "rg"}`,
		wantErr: "subscriptionId",
	}, {
		name:    "missing subscription",
		file:    `{"resourceGroup": "rg", "useManagedIdentityExtension": true}`,
		wantErr: "subscriptionId (--azure-subscription-id, $AZURE_SUBSCRIPTION_ID): is required",
	}, {
		name:    "missing resource group",
		file:    `{"subscriptionId": "s", "useManagedIdentityExtension": true}`,
		wantErr: "resourceGroup",
	}, {
		name:    "no usable credentials",
		file:    `{"subscriptionId": "s", "resourceGroup": "rg"}`,
		wantErr: "credentials: none usable",
	}, {
		name:    "unknown cloud",
		file:    `{"cloud": "AzureMoonCloud", "subscriptionId": "s", "resourceGroup": "rg", "useManagedIdentityExtension": true}`,
		wantErr: `cloud (--azure-cloud, $AZURE_ENVIRONMENT): unknown cloud "AzureMoonCloud"`,
	}, {
		name: "AKS managed identity with a client ID",
		file: aksFile,
		check: func(t *testing.T, c *Config) {
			if c.SubscriptionID != "sub-1" || c.ResourceGroup != "mc_rg_cluster_westeurope" || c.TenantID != "tenant-1" {
				t.Errorf("config = %+v", c)
			}
			if c.Credential.Kind != CredentialManagedIdentity || c.Credential.ManagedIdentityID != "11111111-2222-3333-4444-555555555555" {
				t.Errorf("credential = %+v", c.Credential)
			}
			if c.MaxRetries != DefaultMaxRetries || len(c.LoadBalancers) != 0 {
				t.Errorf("maxRetries %d, load balancers %v", c.MaxRetries, c.LoadBalancers)
			}
		},
	}, {
		name: "keys are case-insensitive",
		file: `{"SUBSCRIPTIONID": "s", "ResourceGroup": "rg", "AADClientID": "id", "aadclientsecret": "secret", "TenantId": "t"}`,
		check: func(t *testing.T, c *Config) {
			if c.SubscriptionID != "s" || c.ResourceGroup != "rg" || c.Credential.Kind != CredentialClientSecret || c.Credential.ClientSecret != "secret" {
				t.Errorf("config = %+v", c)
			}
		},
	}, {
		name: "workload identity wins over managed identity",
		file: aksFile,
		env:  map[string]string{EnvFederatedTokenFile: "/var/run/secrets/azure/tokens/azure-identity-token", EnvClientID: "wi-client"},
		check: func(t *testing.T, c *Config) {
			if c.Credential.Kind != CredentialWorkloadIdentity || c.Credential.ClientID != "wi-client" {
				t.Errorf("credential = %+v", c.Credential)
			}
		},
	}, {
		name: "managed identity resource ID",
		file: strings.Replace(aksFile, "11111111-2222-3333-4444-555555555555", "/subscriptions/s/resourcegroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/id", 1),
		check: func(t *testing.T, c *Config) {
			if c.Credential.Kind != CredentialManagedIdentity || !strings.Contains(c.Credential.ManagedIdentityID, "/subscriptions/") {
				t.Errorf("credential = %+v", c.Credential)
			}
		},
	}, {
		name:   "flags override env override file",
		file:   aksFile,
		env:    map[string]string{EnvSubscriptionID: "sub-env", EnvResourceGroup: "rg-env"},
		mutate: func(o *Options) { o.ResourceGroup = "rg-flag"; o.LoadBalancers = "kubernetes, kubernetes-internal" },
		check: func(t *testing.T, c *Config) {
			if c.SubscriptionID != "sub-env" || c.ResourceGroup != "rg-flag" {
				t.Errorf("subscription %q resource group %q", c.SubscriptionID, c.ResourceGroup)
			}
			if strings.Join(c.LoadBalancers, "|") != "kubernetes|kubernetes-internal" {
				t.Errorf("load balancers %q", c.LoadBalancers)
			}
		},
	}, {
		name: "flags alone, emulator endpoint",
		path: "",
		mutate: func(o *Options) {
			o.SubscriptionID = "s"
			o.ResourceGroup = "rg"
			o.ARMEndpoint = "http://127.0.0.1:8085"
			o.Credential = CredentialNone
		},
		check: func(t *testing.T, c *Config) {
			if !c.InsecureAllowHTTP {
				t.Error("http endpoint without InsecureAllowHTTP")
			}
			if rm := c.Cloud.Services["resourceManager"]; rm.Endpoint != "http://127.0.0.1:8085" || rm.Audience != "http://127.0.0.1:8085" {
				t.Errorf("resource manager = %+v", rm)
			}
		},
	}, {
		name: "explicit maxRetries 0 survives loading",
		file: `{"subscriptionId": "s", "resourceGroup": "rg", "useManagedIdentityExtension": true, "loadBalancerBackendPoolUpdateMaxRetries": 0}`,
		check: func(t *testing.T, c *Config) {
			if c.MaxRetries != 0 {
				t.Errorf("maxRetries = %d, want 0", c.MaxRetries)
			}
		},
	}, {
		name: "negative maxRetries becomes 0",
		file: `{"subscriptionId": "s", "resourceGroup": "rg", "useManagedIdentityExtension": true, "loadBalancerBackendPoolUpdateMaxRetries": -2}`,
		check: func(t *testing.T, c *Config) {
			if c.MaxRetries != 0 {
				t.Errorf("maxRetries = %d, want 0", c.MaxRetries)
			}
		},
	}, {
		name:   "maxRetries flag overrides the file",
		file:   `{"subscriptionId": "s", "resourceGroup": "rg", "useManagedIdentityExtension": true, "loadBalancerBackendPoolUpdateMaxRetries": 0}`,
		mutate: func(o *Options) { o.MaxRetries.V = ptr.To(5) },
		check: func(t *testing.T, c *Config) {
			if c.MaxRetries != 5 {
				t.Errorf("maxRetries = %d, want 5", c.MaxRetries)
			}
		},
	}, {
		name:    "workload identity needs a tenant",
		file:    `{"subscriptionId": "s", "resourceGroup": "rg", "aadClientId": "c"}`,
		env:     map[string]string{EnvFederatedTokenFile: "/token"},
		wantErr: "tenantId",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			o.Getenv = env(tt.env)
			switch {
			case tt.file != "":
				o.ConfigFile = writeFile(t, tt.file)
			default:
				o.ConfigFile = tt.path
			}
			if tt.name == "nothing at all disables admin state" {
				o.ConfigFile = "" // the default path may exist on a developer machine
			}
			if tt.mutate != nil {
				tt.mutate(&o)
			}
			c, err := o.Load()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() = %v", err)
			}
			tt.check(t, c)
		})
	}
}

func TestNotConfiguredIsDistinguishable(t *testing.T) {
	o := NewOptions()
	o.ConfigFile = ""
	o.Getenv = env(nil)
	if _, err := o.Load(); !errors.Is(err, ErrNotConfigured) {
		t.Fatalf("Load() = %v, want ErrNotConfigured", err)
	}
	var fe *FieldError
	o.SubscriptionID = "s"
	if _, err := o.Load(); !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "resourceGroup") {
		t.Fatalf("Load() = %v, want a FieldError for resourceGroup", err)
	}
}

func TestBindFlags(t *testing.T) {
	o := NewOptions()
	fs := flag.NewFlagSet("nodeguard", flag.ContinueOnError)
	o.BindFlags(fs)
	err := fs.Parse([]string{"--azure-subscription-id=s", "--azure-admin-state-max-retries=0", "--azure-load-balancers=a,b", "--azure-admin-state-resync=1m"})
	if err != nil {
		t.Fatal(err)
	}
	if o.SubscriptionID != "s" || o.MaxRetries.V == nil || *o.MaxRetries.V != 0 || o.LoadBalancers != "a,b" || o.ResyncInterval.Minutes() != 1 {
		t.Errorf("options = %+v", o)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if len(f.Usage) < 30 {
			t.Errorf("flag --%s has too little help: %q", f.Name, f.Usage)
		}
	})
}

// --azure-admin-state-restore-hold: 3m by default, 0 turns it off, and a
// negative value is refused (a typo must not silently drop the hold).
func TestRestoreHold(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want time.Duration
		err  bool
	}{
		{nil, 3 * time.Minute, false},
		{[]string{"--azure-admin-state-restore-hold=0"}, 0, false},
		{[]string{"--azure-admin-state-restore-hold=5m"}, 5 * time.Minute, false},
		{[]string{"--azure-admin-state-restore-hold=-1s"}, 0, true},
	} {
		o := NewOptions()
		fs := flag.NewFlagSet("nodeguard", flag.ContinueOnError)
		o.BindFlags(fs)
		if err := fs.Parse(append([]string{"--azure-subscription-id=s", "--azure-resource-group=rg", "--azure-config=", "--azure-credential=none"}, tt.args...)); err != nil {
			t.Fatal(err)
		}
		o.Getenv = env(nil)
		c, err := o.Load()
		var fe *FieldError
		switch {
		case tt.err && !errors.As(err, &fe):
			t.Errorf("%v: Load() = %v, want a FieldError", tt.args, err)
		case !tt.err && err != nil:
			t.Errorf("%v: Load() = %v", tt.args, err)
		case !tt.err && c.RestoreHold != tt.want:
			t.Errorf("%v: RestoreHold = %s, want %s", tt.args, c.RestoreHold, tt.want)
		}
	}
}

// fakeEntra is a minimal Microsoft Entra token endpoint: OpenID discovery and
// a client-credentials token grant, recording the form of each grant.
func fakeEntra(t *testing.T) (*httptest.Server, *[]map[string]string) {
	var grants []map[string]string
	var srv *httptest.Server
	srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/.well-known/openid-configuration"):
			tenant := strings.Split(strings.Trim(r.URL.Path, "/"), "/")[0]
			_ = json.NewEncoder(w).Encode(map[string]string{
				"token_endpoint":         srv.URL + "/" + tenant + "/oauth2/v2.0/token",
				"authorization_endpoint": srv.URL + "/" + tenant + "/oauth2/v2.0/authorize",
				"issuer":                 srv.URL + "/" + tenant + "/v2.0",
			})
		case strings.HasSuffix(r.URL.Path, "/oauth2/v2.0/token"):
			if err := r.ParseForm(); err != nil {
				t.Error(err)
			}
			g := map[string]string{"path": r.URL.Path}
			for k := range r.PostForm {
				g[k] = r.PostForm.Get(k)
			}
			grants = append(grants, g)
			_ = json.NewEncoder(w).Encode(map[string]any{"token_type": "Bearer", "expires_in": 3600, "access_token": "token-for-" + g["client_id"]})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &grants
}

func TestCredentialsAgainstFakeEntra(t *testing.T) {
	srv, grants := fakeEntra(t)
	tokenFile := filepath.Join(t.TempDir(), "azure-identity-token")
	if err := os.WriteFile(tokenFile, []byte("federated-jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		file      string
		env       map[string]string
		wantKind  string
		wantGrant map[string]string
	}{{
		name:      "client secret",
		file:      `{"subscriptionId": "s", "resourceGroup": "rg", "tenantId": "tenant-1", "aadClientId": "sp-client", "aadClientSecret": "sp-secret"}`,
		wantKind:  CredentialClientSecret,
		wantGrant: map[string]string{"path": "/tenant-1/oauth2/v2.0/token", "client_id": "sp-client", "client_secret": "sp-secret", "grant_type": "client_credentials"},
	}, {
		name:     "workload identity token file",
		file:     `{"subscriptionId": "s", "resourceGroup": "rg", "tenantId": "tenant-1", "aadClientId": "sp-client", "aadClientSecret": "sp-secret", "useManagedIdentityExtension": true}`,
		env:      map[string]string{EnvFederatedTokenFile: tokenFile, EnvClientID: "wi-client", EnvTenantID: "tenant-2"},
		wantKind: CredentialWorkloadIdentity,
		wantGrant: map[string]string{"path": "/tenant-2/oauth2/v2.0/token", "client_id": "wi-client", "client_assertion": "federated-jwt",
			"client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			*grants = nil
			o := NewOptions()
			o.ConfigFile = writeFile(t, tt.file)
			o.AuthorityHost = srv.URL
			o.Getenv = env(tt.env)
			c, err := o.Load()
			if err != nil {
				t.Fatal(err)
			}
			if c.Credential.Kind != tt.wantKind {
				t.Fatalf("kind = %s, want %s", c.Credential.Kind, tt.wantKind)
			}
			cred, err := c.NewCredential(azcore.ClientOptions{Transport: srv.Client()})
			if err != nil {
				t.Fatal(err)
			}
			tok, err := cred.GetToken(context.Background(), policy.TokenRequestOptions{Scopes: []string{"https://management.azure.com/.default"}})
			if err != nil {
				t.Fatalf("GetToken: %v", err)
			}
			if len(*grants) != 1 {
				t.Fatalf("%d token grants, want 1", len(*grants))
			}
			for k, v := range tt.wantGrant {
				if got := (*grants)[0][k]; got != v {
					t.Errorf("grant %s = %q, want %q", k, got, v)
				}
			}
			if want := "token-for-" + tt.wantGrant["client_id"]; tok.Token != want {
				t.Errorf("token %q, want %q", tok.Token, want)
			}
		})
	}
}
