package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/bcd/pki"
)

// TrustError is a gateway whose TLS chain fails the pin or does not verify. It is
// never worth retrying: the answer will not change until someone fixes the pin or
// the server's certificate.
type TrustError struct {
	Err error
}

func (e *TrustError) Error() string { return "untrusted gateway certificate: " + e.Err.Error() }
func (e *TrustError) Unwrap() error { return e.Err }

// ServerName is the name a gateway certificate must carry: override
// (gateway_server_name) when set, else the host of gatewayURL.
func ServerName(gatewayURL, override string) (string, error) {
	if override != "" {
		return override, nil
	}
	u, err := url.Parse(gatewayURL)
	if err != nil {
		return "", fmt.Errorf("gateway url: %w", err)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("gateway url %q has no host", gatewayURL)
	}
	return u.Hostname(), nil
}

// PinnedTLSConfig is a client TLS configuration that trusts one CA: the certificate
// in the server's chain whose SPKI pin is servingCAPin. The chain is accepted only
// if it holds such a certificate and the leaf verifies to it for serverName. The
// system roots play no part, so a public CA cannot vouch for a gateway.
func PinnedTLSConfig(servingCAPin, serverName string) (*tls.Config, error) {
	if _, err := pki.ParsePin(servingCAPin); err != nil {
		return nil, fmt.Errorf("serving_ca_spki_pin: %w", err)
	}
	if serverName == "" {
		return nil, errors.New("no server name to verify the gateway certificate for")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// The standard verification is replaced, not skipped: VerifyConnection
		// runs on every handshake, resumed ones included.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := VerifyPinnedChain(cs.PeerCertificates, servingCAPin, serverName, time.Now()); err != nil {
				return &TrustError{Err: err}
			}
			return nil
		},
	}, nil
}

// VerifyPinnedChain checks a server chain (leaf first) against the serving CA pin.
func VerifyPinnedChain(certs []*x509.Certificate, pin, serverName string, now time.Time) error {
	if len(certs) == 0 {
		return errors.New("the server sent no certificate")
	}
	roots := x509.NewCertPool()
	inter := x509.NewCertPool()
	found := false
	var seen []string
	for i, c := range certs {
		p := pki.CertPin(c)
		if p == pin {
			roots.AddCert(c)
			found = true
		} else {
			seen = append(seen, p)
		}
		if i > 0 {
			inter.AddCert(c)
		}
	}
	if !found {
		return fmt.Errorf("no certificate in the chain has serving_ca_spki_pin %s (the chain has %s): %w",
			pin, strings.Join(seen, ", "), pki.ErrPinMismatch)
	}
	host := serverName
	if h, _, err := net.SplitHostPort(serverName); err == nil {
		host = h
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		DNSName:       host,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("the certificate does not verify to the pinned serving CA for %s: %w", host, err)
	}
	return nil
}

// ClientTLSConfig is PinnedTLSConfig presenting the node certificate for mutual
// TLS. The certificate is always offered, whatever CAs the server says it accepts,
// so a refusal comes from the gateway with a reason instead of a silent empty
// certificate.
func ClientTLSConfig(id *Identity, servingCAPin, serverName string) (*tls.Config, error) {
	return ClientTLSConfigFor(func() *Identity { return id }, servingCAPin, serverName)
}

// ClientTLSConfigFor is ClientTLSConfig presenting, at each handshake, the
// identity current returns: a renewed certificate is used from the next
// connection on.
func ClientTLSConfigFor(current func() *Identity, servingCAPin, serverName string) (*tls.Config, error) {
	cfg, err := PinnedTLSConfig(servingCAPin, serverName)
	if err != nil {
		return nil, err
	}
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert := current().TLSCertificate()
		return &cert, nil
	}
	return cfg, nil
}

// DownloadTLSConfig is the client TLS configuration self-update downloads a
// release with: a server is trusted when its chain verifies to the system roots
// (a release on a public host), or when it holds the serving CA of
// servingCAPin and the leaf verifies to it (the control plane's own downloads
// route, served under its serving CA). An empty pin trusts the system roots
// only. The download is checked against the signed manifest either way: TLS
// only keeps the transfer private and the URL honest.
func DownloadTLSConfig(servingCAPin string) (*tls.Config, error) {
	if servingCAPin != "" {
		if _, err := pki.ParsePin(servingCAPin); err != nil {
			return nil, fmt.Errorf("serving_ca_spki_pin: %w", err)
		}
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Replaced, not skipped: VerifyConnection runs on every handshake.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return &TrustError{Err: errors.New("the server sent no certificate")}
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, sysErr := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: cs.ServerName, Intermediates: inter})
			if sysErr == nil {
				return nil
			}
			if servingCAPin == "" {
				return &TrustError{Err: sysErr}
			}
			if err := VerifyPinnedChain(cs.PeerCertificates, servingCAPin, cs.ServerName, time.Now()); err != nil {
				return &TrustError{Err: fmt.Errorf("neither the system roots (%v) nor the serving CA vouch for it: %w", sysErr, err)}
			}
			return nil
		},
	}, nil
}
