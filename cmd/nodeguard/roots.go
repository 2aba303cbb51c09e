package main

// The image holds nothing but nodeguard (hack/release/image): no CA
// certificates. With no system roots, Go falls back to this bundle (Mozilla's,
// as Debian ships it), so nodeguard can still verify Azure Resource Manager
// and Microsoft Entra ID. Roots on the host or in SSL_CERT_FILE/SSL_CERT_DIR
// take precedence.
import _ "golang.org/x/crypto/x509roots/fallback"
