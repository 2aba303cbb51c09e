package config

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
)

// Credential kinds (--azure-credential).
const (
	CredentialAuto             = "auto"
	CredentialWorkloadIdentity = "workload-identity"
	CredentialManagedIdentity  = "managed-identity"
	CredentialClientSecret     = "client-secret"
	// CredentialNone sends a placeholder token: for ARM emulators only.
	CredentialNone = "none"
)

// CredentialConfig says how to authenticate.
type CredentialConfig struct {
	// Kind is the chosen kind (never CredentialAuto).
	Kind          string
	TenantID      string
	ClientID      string
	ClientSecret  string
	TokenFile     string
	AuthorityHost string
	// ManagedIdentityID is a user-assigned identity: a resource ID when it
	// contains "/subscriptions/", else a client ID; empty: system-assigned.
	ManagedIdentityID string
}

// chooseCredential picks the credential in cloud-provider-azure's order:
// workload identity (a federated token file is configured), then managed
// identity (useManagedIdentityExtension), then client secret.
func chooseCredential(o Options, f File, getenv func(string) string, c *Config) (CredentialConfig, error) {
	cc := CredentialConfig{
		TenantID:          c.TenantID,
		ClientID:          firstNonEmpty(o.ClientID, getenv(EnvClientID), f.AADClientID),
		ClientSecret:      firstNonEmpty(getenv(EnvClientSecret), f.AADClientSecret),
		TokenFile:         firstNonEmpty(getenv(EnvFederatedTokenFile), f.AADFederatedTokenFile),
		AuthorityHost:     c.Cloud.ActiveDirectoryAuthorityHost,
		ManagedIdentityID: firstNonEmpty(getenv(EnvUserAssignedIdentty), f.UserAssignedIdentityID),
	}
	kind := o.Credential
	if kind == "" {
		kind = CredentialAuto
	}
	if kind == CredentialAuto {
		switch {
		case cc.TokenFile != "" || f.UseFederatedWorkloadIdentityExtension:
			kind = CredentialWorkloadIdentity
		case f.UseManagedIdentityExtension:
			kind = CredentialManagedIdentity
		case cc.ClientID != "" && cc.ClientSecret != "" && !strings.EqualFold(cc.ClientSecret, "msi"):
			kind = CredentialClientSecret
		default:
			return cc, &FieldError{Field: "credentials", Reason: "none usable: configure workload identity ($" + EnvFederatedTokenFile + " or aadFederatedTokenFile), useManagedIdentityExtension, or aadClientId with aadClientSecret"}
		}
	}
	cc.Kind = kind
	switch kind {
	case CredentialWorkloadIdentity:
		if cc.TokenFile == "" {
			return cc, &FieldError{Field: "aadFederatedTokenFile ($" + EnvFederatedTokenFile + ")", Reason: "is required for workload identity"}
		}
		if cc.ClientID == "" {
			return cc, &FieldError{Field: "aadClientId (--azure-client-id, $" + EnvClientID + ")", Reason: "is required for workload identity"}
		}
		if cc.TenantID == "" {
			return cc, &FieldError{Field: "tenantId (--azure-tenant-id, $" + EnvTenantID + ")", Reason: "is required for workload identity"}
		}
	case CredentialManagedIdentity, CredentialNone:
	case CredentialClientSecret:
		if cc.ClientID == "" || cc.ClientSecret == "" {
			return cc, &FieldError{Field: "aadClientId/aadClientSecret", Reason: "both are required for a client secret"}
		}
		if cc.TenantID == "" {
			return cc, &FieldError{Field: "tenantId (--azure-tenant-id, $" + EnvTenantID + ")", Reason: "is required for a client secret"}
		}
	default:
		return cc, &FieldError{Field: "--azure-credential", Reason: fmt.Sprintf("unknown kind %q", kind)}
	}
	return cc, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// NewCredential builds the azidentity credential for c. opts carries the
// cloud and, in tests, a transport.
func (c *Config) NewCredential(opts azcore.ClientOptions) (azcore.TokenCredential, error) {
	cc := c.Credential
	opts.Cloud = c.Cloud
	switch cc.Kind {
	case CredentialWorkloadIdentity:
		return azidentity.NewWorkloadIdentityCredential(&azidentity.WorkloadIdentityCredentialOptions{
			ClientOptions: opts, ClientID: cc.ClientID, TenantID: cc.TenantID, TokenFilePath: cc.TokenFile,
			DisableInstanceDiscovery: customAuthority(c.Cloud),
		})
	case CredentialManagedIdentity:
		mo := &azidentity.ManagedIdentityCredentialOptions{ClientOptions: opts}
		switch {
		case strings.Contains(strings.ToLower(cc.ManagedIdentityID), "/subscriptions/"):
			mo.ID = azidentity.ResourceID(cc.ManagedIdentityID)
		case cc.ManagedIdentityID != "":
			mo.ID = azidentity.ClientID(cc.ManagedIdentityID)
		}
		return azidentity.NewManagedIdentityCredential(mo)
	case CredentialClientSecret:
		return azidentity.NewClientSecretCredential(cc.TenantID, cc.ClientID, cc.ClientSecret, &azidentity.ClientSecretCredentialOptions{
			ClientOptions: opts, DisableInstanceDiscovery: customAuthority(c.Cloud),
		})
	case CredentialNone:
		return StaticToken("nodeguard-emulator-token"), nil
	}
	return nil, fmt.Errorf("azure config: no credential of kind %q", cc.Kind)
}

// StaticToken is a credential that always returns the same token: for
// emulators and tests, never for Azure.
type StaticToken string

// GetToken implements azcore.TokenCredential.
func (s StaticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// customAuthority reports an authority host of no known cloud (Azure Stack,
// tests), where Entra instance discovery cannot work.
func customAuthority(c cloud.Configuration) bool {
	for _, known := range clouds {
		if strings.EqualFold(c.ActiveDirectoryAuthorityHost, known.ActiveDirectoryAuthorityHost) {
			return false
		}
	}
	return true
}
