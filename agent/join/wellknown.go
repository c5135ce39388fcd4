package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// WellKnownTimeout bounds the whole fetch of the well-known document.
const WellKnownTimeout = 30 * time.Second

// errRedirect refuses redirects of the well-known fetch: the document must come from
// the server the operator named, not from wherever that server points.
var errRedirect = errors.New("redirects are refused")

// FetchWellKnown reads <server>/.well-known/better-compute over the control plane's
// own TLS, verified with roots (nil: the system roots, which SSL_CERT_FILE can
// replace), within WellKnownTimeout, at most protocol.MaxWellKnownSize bytes, and
// without following redirects.
func FetchWellKnown(ctx context.Context, server string, roots *x509.CertPool) (*protocol.WellKnown, error) {
	u := strings.TrimRight(server, "/") + protocol.PathWellKnown
	client := &http.Client{
		Timeout: WellKnownTimeout,
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 15 * time.Second,
		},
		CheckRedirect: func(req *http.Request, _ []*http.Request) error {
			return fmt.Errorf("%s answers with a redirect to %s: %w", u, req.URL.Redacted(), errRedirect)
		},
	}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("well-known document: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	if resp.ContentLength > protocol.MaxWellKnownSize {
		return nil, fmt.Errorf("GET %s: the document is %d bytes, over the %d-byte limit", u, resp.ContentLength, protocol.MaxWellKnownSize)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, protocol.MaxWellKnownSize+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if len(data) > protocol.MaxWellKnownSize {
		return nil, fmt.Errorf("GET %s: the document is over the %d-byte limit", u, protocol.MaxWellKnownSize)
	}
	doc, err := ParseWellKnown(data)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	return doc, nil
}

// ParseWellKnown decodes the document. Unknown members are ignored: a newer control
// plane may publish more, and everything bcd uses is checked against the pins.
func ParseWellKnown(data []byte) (*protocol.WellKnown, error) {
	if len(data) > protocol.MaxWellKnownSize {
		return nil, fmt.Errorf("the document is over the %d-byte limit", protocol.MaxWellKnownSize)
	}
	var doc protocol.WellKnown
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("the document is not the better-compute well-known JSON: %w", err)
	}
	return &doc, nil
}

// Bootstrap is what a machine without config.toml learns from the document.
type Bootstrap struct {
	// GatewayURL and ServerName are the gateway section.
	GatewayURL, ServerName string
	// Pins are the pins to join with: the ones given, or on a fakehw build the
	// document's own.
	Pins pki.Pins
	// JWK is the join encryption key as published, and EncryptionKey the key,
	// already matched to Pins.JoinEncryption.
	JWK           []byte
	EncryptionKey *ecdsa.PublicKey
}

// CheckWellKnown checks the document against the pins given on the command line and
// returns what to join with. A published pin that differs from one given is
// refused; a pin not given is taken from the document only when allowUnpinned (a
// fakehw build). wellKnownURL names the document in messages.
func CheckWellKnown(doc *protocol.WellKnown, given pki.Pins, wellKnownURL string, allowUnpinned, allowHTTP bool) (*Bootstrap, error) {
	if doc.Gateway == nil || doc.Gateway.URL == "" {
		return nil, fmt.Errorf("refusing to join: %s has no gateway.url (the control plane does not publish where its gateway is); install /etc/bcd/config.toml instead", wellKnownURL)
	}
	gu, err := url.Parse(doc.Gateway.URL)
	if err != nil || gu.Host == "" || (gu.Scheme != "https" && !(allowHTTP && gu.Scheme == "http")) {
		return nil, fmt.Errorf("refusing to join: %s publishes gateway.url %q, not an https:// URL", wellKnownURL, doc.Gateway.URL)
	}
	var pins pki.Pins
	for _, p := range []struct {
		what, flag       string
		given, published string
		dst              *string
	}{
		{"serving CA pin (gateway.servingCaPin)", "--serving-ca-pin", given.ServingCA, doc.Gateway.ServingCAPin, &pins.ServingCA},
		{"join signing key pin (join.signingKeyPin)", "--join-signing-pin", given.JoinSigning, doc.Join.SigningKeyPin, &pins.JoinSigning},
		{"join encryption key pin (join.encryptionKeyPin)", "--join-encryption-pin", given.JoinEncryption, doc.Join.EncryptionKeyPin, &pins.JoinEncryption},
	} {
		switch {
		case p.given != "" && p.published != "" && p.published != p.given:
			return nil, fmt.Errorf("refusing to join: %s publishes the %s %s, not the %s given (%s)", wellKnownURL, p.what, p.published, p.flag, p.given)
		case p.given != "":
			*p.dst = p.given
		case !allowUnpinned:
			return nil, fmt.Errorf("refusing to join: no %s given", p.flag)
		case p.published == "":
			return nil, fmt.Errorf("refusing to join: %s publishes no %s and no %s was given", wellKnownURL, p.what, p.flag)
		default:
			*p.dst = p.published
		}
	}
	if err := pins.Validate(); err != nil {
		return nil, fmt.Errorf("refusing to join: %w", err)
	}
	if len(doc.Join.EncryptionJWK) == 0 {
		return nil, fmt.Errorf("refusing to join: %s has no join.encryptionJwk", wellKnownURL)
	}
	key, err := pki.JWKMatchesPin(doc.Join.EncryptionJWK, pins.JoinEncryption)
	if err != nil {
		return nil, fmt.Errorf("refusing to join: %s join.encryptionJwk: %w", wellKnownURL, err)
	}
	return &Bootstrap{
		GatewayURL:    doc.Gateway.URL,
		ServerName:    doc.Gateway.ServerName,
		Pins:          pins,
		JWK:           []byte(doc.Join.EncryptionJWK),
		EncryptionKey: key,
	}, nil
}
