package armemulator

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
)

// TokenEndpoint plays Microsoft Entra ID for a client-secret credential: the
// tenant's OpenID configuration and its token endpoint (client credentials
// grant), over HTTPS as the Azure SDK requires of an authority host. Point
// nodeguard at it with --azure-authority-host=AuthorityHost(), and make
// nodeguard trust its certificate (SSL_CERT_FILE=CAFile()).
//
// It issues a fresh random access token to the configured client ID and
// secret, and answers anything else as Entra does (400 for an unknown tenant,
// 401 invalid_client for a wrong secret), never echoing what the client sent.
type TokenEndpoint struct {
	tenant, clientID, secret string
	srv                      *httptest.Server
	caFile                   string

	mu      sync.Mutex
	issued  []string
	refused int
	refuse  int
}

// StartTokenEndpoint serves a token endpoint for one tenant and client on a
// free local port. caFile is where its certificate is written, for clients to
// trust.
func StartTokenEndpoint(tenant, clientID, secret, caFile string) (*TokenEndpoint, error) {
	t := &TokenEndpoint{tenant: tenant, clientID: clientID, secret: secret, caFile: caFile}
	t.srv = httptest.NewUnstartedServer(http.HandlerFunc(t.serve))
	t.srv.StartTLS()
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: t.srv.Certificate().Raw})
	if err := os.WriteFile(caFile, cert, 0o644); err != nil {
		t.srv.Close()
		return nil, fmt.Errorf("writing the token endpoint's certificate: %w", err)
	}
	return t, nil
}

// AuthorityHost is the URL to give as the credential's authority host.
func (t *TokenEndpoint) AuthorityHost() string { return t.srv.URL + "/" }

// CAFile holds the PEM certificate clients must trust.
func (t *TokenEndpoint) CAFile() string { return t.caFile }

// Close stops the endpoint.
func (t *TokenEndpoint) Close() { t.srv.Close() }

// Issued returns every access token handed out, oldest first.
func (t *TokenEndpoint) Issued() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.issued...)
}

// IssuedToken reports whether the endpoint handed out token.
func (t *TokenEndpoint) IssuedToken(token string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Contains(t.issued, token)
}

// Refused is how many token requests were answered with an error.
func (t *TokenEndpoint) Refused() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refused
}

// RefuseNext makes the next n token requests fail as for an expired client
// secret, whatever they carry.
func (t *TokenEndpoint) RefuseNext(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refuse = n
}

func (t *TokenEndpoint) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) == 4 && strings.Join(parts[1:], "/") == "v2.0/.well-known/openid-configuration" && r.Method == http.MethodGet:
		t.openIDConfiguration(w, parts[0])
	case len(parts) == 4 && strings.Join(parts[1:], "/") == "oauth2/v2.0/token" && r.Method == http.MethodPost:
		t.token(w, r, parts[0])
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not_found", "error_description": "unknown path " + r.URL.Path})
	}
}

func (t *TokenEndpoint) knownTenant(w http.ResponseWriter, tenant string) bool {
	if strings.EqualFold(tenant, t.tenant) {
		return true
	}
	t.deny(w, http.StatusBadRequest, "invalid_request", "AADSTS90002: Tenant '"+tenant+"' not found.")
	return false
}

func (t *TokenEndpoint) openIDConfiguration(w http.ResponseWriter, tenant string) {
	if !t.knownTenant(w, tenant) {
		return
	}
	base := t.srv.URL + "/" + t.tenant
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                 base + "/v2.0",
		"authorization_endpoint": base + "/oauth2/v2.0/authorize",
		"token_endpoint":         base + "/oauth2/v2.0/token",
		"tenant_region_scope":    "EU",
	})
}

func (t *TokenEndpoint) token(w http.ResponseWriter, r *http.Request, tenant string) {
	if !t.knownTenant(w, tenant) {
		return
	}
	if err := r.ParseForm(); err != nil {
		t.deny(w, http.StatusBadRequest, "invalid_request", "AADSTS900144: The request body must be form-encoded.")
		return
	}
	t.mu.Lock()
	refuse := t.refuse > 0
	if refuse {
		t.refuse--
	}
	t.mu.Unlock()
	switch {
	case r.PostForm.Get("grant_type") != "client_credentials":
		t.deny(w, http.StatusBadRequest, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type.")
	case r.PostForm.Get("client_id") != t.clientID:
		t.deny(w, http.StatusBadRequest, "unauthorized_client", "AADSTS700016: Application not found in the directory.")
	case refuse:
		t.deny(w, http.StatusUnauthorized, "invalid_client", "AADSTS7000222: The provided client secret keys for app '"+t.clientID+"' are expired.")
	case r.PostForm.Get("client_secret") != t.secret:
		t.deny(w, http.StatusUnauthorized, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
	default:
		token := newToken()
		t.mu.Lock()
		t.issued = append(t.issued, token)
		t.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{
			"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token,
		})
	}
}

func (t *TokenEndpoint) deny(w http.ResponseWriter, status int, code, description string) {
	t.mu.Lock()
	t.refused++
	t.mu.Unlock()
	writeJSON(w, status, map[string]any{"error": code, "error_description": description, "error_codes": []int{}})
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "emulator-access-token-" + hex.EncodeToString(b)
}
