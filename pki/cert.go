package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
)

const (
	// caValidity is long because replacing a CA means re-pinning every
	// machine; the CA keys stay offline-grade files on the control plane.
	caValidity = 10 * 365 * 24 * time.Hour
	// backdate absorbs clock skew between the control plane and a machine
	// whose clock has not been set yet (a ramdisk before NTP).
	backdate = 5 * time.Minute
	orgName  = "better-compute"
)

// newKey makes a P-256 key, the only kind in bcd's PKI.
func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate P-256 key: %w", err)
	}
	return k, nil
}

// randomSerial returns a positive 128-bit serial. Random serials keep
// certificates unpredictable and need no counter shared between processes.
func randomSerial() (*big.Int, error) {
	for {
		n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
		if err != nil {
			return nil, fmt.Errorf("serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

// newCA self-signs a CA certificate for key. A CA may only issue leaves
// (MaxPathLen 0). For the node CA, constrainURI limits what it can certify to
// SPIFFE IDs of its own trust domain, which verifiers enforce.
func newCA(key *ecdsa.PrivateKey, cn, trustDomain string, constrainURI bool, now time.Time) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{orgName}, CommonName: cn},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	if constrainURI {
		tmpl.PermittedURIDomains = []string{trustDomain}
		tmpl.PermittedDNSDomainsCritical = true // RFC 5280: name constraints are critical
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create %s certificate: %w", cn, err)
	}
	return der, nil
}

// leafValidity returns the validity of a leaf issued now for ttl, cut at the
// CA's own expiry: a leaf that outlives its issuer fails anyway, and a clear
// NotAfter beats a chain that breaks on a date nobody sees.
func leafValidity(ca *x509.Certificate, ttl time.Duration, now time.Time) (time.Time, time.Time, error) {
	if ttl <= 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("certificate lifetime %v: want more than zero", ttl)
	}
	if !now.Before(ca.NotAfter) {
		return time.Time{}, time.Time{}, fmt.Errorf("CA %q expired at %s", ca.Subject.CommonName, ca.NotAfter.UTC().Format(time.RFC3339))
	}
	notAfter := now.Add(ttl)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	return now.Add(-backdate), notAfter, nil
}

// IssueServingCert issues a TLS server certificate for the api and gateway,
// signed by the serving CA, for hosts (DNS names, optionally "*.", or IP
// addresses). The chain holds the serving CA after the leaf because agents
// pin the CA's key, not the leaf's: they need the CA certificate on the wire
// to compare it with serving_ca_spki_pin.
func (b *Bundle) IssueServingCert(hosts []string, ttl time.Duration) (tls.Certificate, error) {
	if b == nil || b.Public == nil || b.Public.servingCA == nil || b.ServingCAKey == nil {
		return tls.Certificate{}, errors.New("serving certificate: bundle has no serving CA key (load it with LoadBundle)")
	}
	if len(hosts) == 0 {
		return tls.Certificate{}, errors.New("serving certificate: no hosts")
	}
	var dnsNames []string
	var ips []net.IP
	for _, h := range hosts {
		if ip, err := netip.ParseAddr(h); err == nil {
			if ip.Zone() != "" {
				return tls.Certificate{}, fmt.Errorf("serving certificate: host %q: an IP with a zone cannot be certified", human.ShortN(h, 80))
			}
			ips = append(ips, net.IP(ip.AsSlice()))
			continue
		}
		name := strings.ToLower(h)
		if err := checkHostname(name); err != nil {
			return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
		}
		dnsNames = append(dnsNames, name)
	}
	ca := b.Public.servingCA
	notBefore, notAfter, err := leafValidity(ca, ttl, time.Now())
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	key, err := newKey()
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{orgName}, CommonName: commonName(hosts[0])},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, b.ServingCAKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("serving certificate: %w", err)
	}
	return tls.Certificate{
		Certificate: [][]byte{der, ca.Raw},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}

// commonName returns host if it fits X.509's 64-character limit on a common
// name, else nothing: TLS clients match the SANs, the CN is only a label.
func commonName(host string) string {
	if len(host) > 64 {
		return ""
	}
	return host
}

// checkHostname accepts a lower-case DNS name, or one whose first label is "*".
func checkHostname(name string) error {
	rest := strings.TrimPrefix(name, "*.")
	if rest == "" || len(rest) > 253 {
		return fmt.Errorf("host %q: not a DNS name or IP address", human.ShortN(name, 80))
	}
	for _, l := range strings.Split(rest, ".") {
		if !dnsLabelRE.MatchString(l) {
			return fmt.Errorf("host %q: not a DNS name or IP address", human.ShortN(name, 80))
		}
	}
	return nil
}

// IssueNodeCert issues a node's client certificate from its CSR, signed by the
// node CA. Only the CSR's key is used: its subject and requested extensions
// are ignored, and the identity is the URI SAN
// spiffe://<trust-domain>/<role>/<node-id> the control plane decided. The
// result is the leaf in DER; the node CA is the whole chain above it.
func (b *Bundle) IssueNodeCert(csr *x509.CertificateRequest, role, nodeID string, ttl time.Duration) ([]byte, error) {
	if b == nil || b.Public == nil || b.Public.nodeCA == nil || b.NodeCAKey == nil {
		return nil, errors.New("node certificate: bundle has no node CA key (load it with LoadBundle)")
	}
	if csr == nil {
		return nil, errors.New("node certificate: no CSR")
	}
	// The signature proves the requester holds the key being certified.
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("node certificate: CSR signature: %w", err)
	}
	pub, err := asP256(csr.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("node certificate: CSR key: %w", err)
	}
	if err := ValidateRole(role); err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	if err := ValidateNodeID(nodeID); err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	ca := b.Public.nodeCA
	notBefore, notAfter, err := leafValidity(ca, ttl, time.Now())
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	id := &url.URL{Scheme: "spiffe", Host: b.Public.TrustDomain, Path: "/" + role + "/" + nodeID}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{orgName}, OrganizationalUnit: []string{role}, CommonName: nodeID},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, b.NodeCAKey)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	return der, nil
}

// NewKeyAndCSR makes the agent's P-256 key and a CSR for it in PEM. The CSR
// carries no names: the control plane decides the identity.
func NewKeyAndCSR() (*ecdsa.PrivateKey, []byte, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	csr, err := NewCSR(key)
	if err != nil {
		return nil, nil, err
	}
	return key, csr, nil
}

// NewP256Key makes a P-256 key in memory, the node key of a host without a TPM.
func NewP256Key() (*ecdsa.PrivateKey, error) { return newKey() }

// NewCSR makes a CSR in PEM for the key behind signer, which signs it (a key in
// memory or one in a TPM alike). It carries no names: the control plane decides
// the identity.
func NewCSR(signer crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader,
		&x509.CertificateRequest{SignatureAlgorithm: x509.ECDSAWithSHA256}, signer)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der}), nil
}

// ParseCSRPEM decodes one "CERTIFICATE REQUEST" PEM block and checks what
// IssueNodeCert will: a valid self-signature over a P-256 key.
func ParseCSRPEM(data []byte) (*x509.CertificateRequest, error) {
	der, err := decodeOnePEM(data, pemCSR)
	if err != nil {
		return nil, fmt.Errorf("CSR: %w", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("CSR signature: %w", err)
	}
	if _, err := asP256(csr.PublicKey); err != nil {
		return nil, fmt.Errorf("CSR key: %w", err)
	}
	return csr, nil
}

// CSRSHA256 is the lower-case hex SHA-256 of a CSR's DER, the value that binds
// a sealed token and a join response to one CSR.
func CSRSHA256(csrDER []byte) string {
	sum := sha256.Sum256(csrDER)
	return hex.EncodeToString(sum[:])
}
