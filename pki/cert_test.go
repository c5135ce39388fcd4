package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

func newCSR(t *testing.T, c elliptic.Curve) (*ecdsa.PrivateKey, *x509.CertificateRequest) {
	t.Helper()
	k := mustKey(t, c)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, k)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return k, csr
}

func TestIssueNodeCert(t *testing.T) {
	b := newTestBundle(t)
	key, csrPEM, err := NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{protocol.RoleNode, protocol.RoleSite, protocol.RoleRamdisk} {
		t.Run(role, func(t *testing.T) {
			der, err := b.IssueNodeCert(csr, role, "m-01_a", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{
				Roots:     b.Public.NodeCAPool(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			}); err != nil {
				t.Fatalf("chain does not verify for client auth: %v", err)
			}
			// A node certificate must not pass as a TLS server.
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.Public.NodeCAPool()}); err == nil {
				t.Error("node certificate verifies for server auth")
			}
			if !key.PublicKey.Equal(leaf.PublicKey) {
				t.Error("leaf does not certify the CSR's key")
			}
			if len(leaf.URIs) != 1 {
				t.Fatalf("URIs = %v, want exactly one", leaf.URIs)
			}
			want := SPIFFEID(DefaultTrustDomain, role, "m-01_a")
			if got := leaf.URIs[0].String(); got != want {
				t.Errorf("URI SAN = %q, want %q", got, want)
			}
			td, r, id, err := ParseSPIFFEID(leaf.URIs[0].String())
			if err != nil || td != DefaultTrustDomain || r != role || id != "m-01_a" {
				t.Errorf("ParseSPIFFEID = %q %q %q %v", td, r, id, err)
			}
			if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
				t.Error("node certificate carries names besides its SPIFFE ID")
			}
			if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 || leaf.SerialNumber.BitLen() < 64 {
				t.Errorf("serial %x is not a positive random 128-bit number", leaf.SerialNumber)
			}
			if d := leaf.NotAfter.Sub(time.Now()); d > time.Hour || d < 59*time.Minute {
				t.Errorf("NotAfter in %v, want about 1h", d)
			}
		})
	}
	t.Run("serials differ", func(t *testing.T) {
		a, _ := b.IssueNodeCert(csr, protocol.RoleNode, "a", time.Hour)
		c, _ := b.IssueNodeCert(csr, protocol.RoleNode, "a", time.Hour)
		ca, _ := x509.ParseCertificate(a)
		cc, _ := x509.ParseCertificate(c)
		if ca.SerialNumber.Cmp(cc.SerialNumber) == 0 {
			t.Error("two certificates share a serial")
		}
	})
	t.Run("clamped to CA", func(t *testing.T) {
		der, err := b.IssueNodeCert(csr, protocol.RoleNode, "a", 100*365*24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(der)
		if !leaf.NotAfter.Equal(b.Public.NodeCA().NotAfter) {
			t.Errorf("NotAfter %v, want the CA's %v", leaf.NotAfter, b.Public.NodeCA().NotAfter)
		}
	})
}

func TestIssueNodeCertRefuses(t *testing.T) {
	b := newTestBundle(t)
	_, good := newCSR(t, elliptic.P256())
	_, p384 := newCSR(t, elliptic.P384())
	_, badSig := newCSR(t, elliptic.P256())
	badSig.Signature[len(badSig.Signature)/2] ^= 0x01

	// Someone else's public key in a CSR they cannot sign for.
	victim := mustKey(t, elliptic.P256())
	stolen := *good
	stolen.PublicKey = &victim.PublicKey

	tests := []struct {
		name   string
		csr    *x509.CertificateRequest
		role   string
		nodeID string
		ttl    time.Duration
	}{
		{"bad CSR signature", badSig, protocol.RoleNode, "n1", time.Hour},
		{"CSR key not its signer", &stolen, protocol.RoleNode, "n1", time.Hour},
		{"P-384 CSR", p384, protocol.RoleNode, "n1", time.Hour},
		{"nil CSR", nil, protocol.RoleNode, "n1", time.Hour},
		{"unknown role", good, "admin", "n1", time.Hour},
		{"empty role", good, "", "n1", time.Hour},
		{"upper-case node id", good, protocol.RoleNode, "N1", time.Hour},
		{"node id with slash", good, protocol.RoleNode, "n1/../x", time.Hour},
		{"node id with dot", good, protocol.RoleNode, "n.1", time.Hour},
		{"empty node id", good, protocol.RoleNode, "", time.Hour},
		{"node id too long", good, protocol.RoleNode, strings.Repeat("a", 65), time.Hour},
		{"zero ttl", good, protocol.RoleNode, "n1", 0},
		{"negative ttl", good, protocol.RoleNode, "n1", -time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := b.IssueNodeCert(tt.csr, tt.role, tt.nodeID, tt.ttl); err == nil {
				t.Error("IssueNodeCert succeeded")
			}
		})
	}
	if _, err := (&Bundle{Public: b.Public}).IssueNodeCert(good, protocol.RoleNode, "n1", time.Hour); err == nil {
		t.Error("IssueNodeCert without the node CA key succeeded")
	}
}

// TestNodeCANameConstraint: even with the node CA key, a certificate for
// another trust domain does not verify.
func TestNodeCANameConstraint(t *testing.T) {
	b := newTestBundle(t)
	k := mustKey(t, elliptic.P256())
	u, _ := url.Parse("spiffe://evil.example/node/n1")
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, b.Public.NodeCA(), &k.PublicKey, b.NodeCAKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:     b.Public.NodeCAPool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	var ci x509.CertificateInvalidError
	if !errors.As(err, &ci) || ci.Reason != x509.CANotAuthorizedForThisName {
		t.Errorf("verify: err = %v, want CANotAuthorizedForThisName", err)
	}
}

func TestIssueServingCert(t *testing.T) {
	b := newTestBundle(t)
	cert, err := b.IssueServingCert([]string{"gw.example.com", "127.0.0.1", "::1", "*.api.example.com"}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.Certificate) != 2 || !b.Public.ServingCA().Equal(mustParse(t, cert.Certificate[1])) {
		t.Fatal("chain is not leaf + serving CA")
	}
	for _, host := range []string{"gw.example.com", "127.0.0.1", "::1", "x.api.example.com"} {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: b.Public.ServingCAPool(), DNSName: host}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: b.Public.ServingCAPool(), DNSName: "other.example.com"}); err == nil {
		t.Error("leaf verifies for a host it was not issued for")
	}
	// The serving CA does not vouch for node certificates, nor the node CA for servers.
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: b.Public.NodeCAPool(), DNSName: "gw.example.com"}); err == nil {
		t.Error("serving leaf verifies under the node CA")
	}

	for _, hosts := range [][]string{nil, {""}, {"bad host"}, {"a..b"}, {"fe80::1%eth0"}, {"http://x"}} {
		if _, err := b.IssueServingCert(hosts, time.Hour); err == nil {
			t.Errorf("IssueServingCert(%q) succeeded", hosts)
		}
	}
	if _, err := b.IssueServingCert([]string{"x.example"}, 0); err == nil {
		t.Error("IssueServingCert with zero ttl succeeded")
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPinnedMTLS runs the handshake the gateway and an agent will: the agent
// trusts the serving CA only through its pin, the gateway trusts node
// certificates through the node CA.
func TestPinnedMTLS(t *testing.T) {
	b := newTestBundle(t)
	serving, err := b.IssueServingCert([]string{"localhost", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodeKey, csrPEM, err := NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	nodeDER, err := b.IssueNodeCert(csr, protocol.RoleSite, "site-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serving},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    b.Public.NodeCAPool(),
		MinVersion:   tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- err.Error()
			return
		}
		peer <- tc.ConnectionState().PeerCertificates[0].URIs[0].String()
		io.WriteString(c, "ok")
	}()

	pin := b.Public.Pins().ServingCA
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
		ServerName:   "127.0.0.1",
		Certificates: []tls.Certificate{{Certificate: [][]byte{nodeDER}, PrivateKey: nodeKey}},
		MinVersion:   tls.VersionTLS13,
		// System roots know nothing of the serving CA; the pin is the trust.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinnedChain(pin, cs)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 2)
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatal(err)
	}
	if got, want := <-peer, SPIFFEID(DefaultTrustDomain, protocol.RoleSite, "site-1"); got != want {
		t.Errorf("gateway saw %q, want %q", got, want)
	}
}

// verifyPinnedChain accepts a server chain in which a CA certificate carries
// the pinned key and certifies the leaf for the server name.
func verifyPinnedChain(pin string, cs tls.ConnectionState) error {
	for _, c := range cs.PeerCertificates[1:] {
		if CertPin(c) != pin {
			continue
		}
		roots := x509.NewCertPool()
		roots.AddCert(c)
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: cs.ServerName})
		return err
	}
	return fmt.Errorf("no certificate in the chain has pin %s", pin)
}

// TestOpenSSLVerifiesCerts checks the certificates against another X.509
// implementation, including the node CA's critical URI name constraint.
func TestOpenSSLVerifiesCerts(t *testing.T) {
	testenv.NeedTool(t, "openssl")
	b := newTestBundle(t)
	_, csrPEM, err := NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := ParseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	nodeDER, err := b.IssueNodeCert(csr, protocol.RoleNode, "n1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := b.IssueServingCert([]string{"gw.example.com", "10.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	write := func(name string, der []byte) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	node := write("node.pem", nodeDER)
	srv := write("serving.pem", serving.Certificate[0])
	for _, tt := range []struct {
		ca, leaf, purpose string
		extra             []string
	}{
		{NodeCACertFile, node, "sslclient", nil},
		{ServingCACertFile, srv, "sslserver", []string{"-verify_hostname", "gw.example.com"}},
		{ServingCACertFile, srv, "sslserver", []string{"-verify_ip", "10.0.0.1"}},
	} {
		args := append([]string{"verify", "-CAfile", filepath.Join(b.Dir, tt.ca), "-purpose", tt.purpose}, tt.extra...)
		out := run(t, nil, "openssl", append(args, tt.leaf)...)
		if !strings.HasSuffix(strings.TrimSpace(string(out)), ": OK") {
			t.Errorf("openssl %v: %s", args, out)
		}
	}
	// And the CSR bcd makes is one openssl accepts.
	csrPath := filepath.Join(tmp, "csr.pem")
	if err := os.WriteFile(csrPath, csrPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, nil, "openssl", "req", "-in", csrPath, "-verify", "-noout")
}

func TestCSRHelpers(t *testing.T) {
	_, csrPEM, err := NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(csrPEM)
	sum := sha256.Sum256(blk.Bytes)
	if got, want := CSRSHA256(blk.Bytes), hex.EncodeToString(sum[:]); got != want || got != strings.ToLower(got) || len(got) != 64 {
		t.Errorf("CSRSHA256 = %q, want %q", got, want)
	}
	tampered := append([]byte(nil), blk.Bytes...)
	tampered[len(tampered)-5] ^= 0x01
	for name, data := range map[string][]byte{
		"tampered signature": pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: tampered}),
		"wrong block type":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes}),
		"two blocks":         append(append([]byte(nil), csrPEM...), csrPEM...),
		"not PEM":            blk.Bytes,
	} {
		if _, err := ParseCSRPEM(data); err == nil {
			t.Errorf("ParseCSRPEM accepted %s", name)
		}
	}
}

func TestSPIFFEID(t *testing.T) {
	tests := []struct {
		uri              string
		td, role, nodeID string
		ok               bool
	}{
		{"spiffe://better-compute.local/node/n1", "better-compute.local", "node", "n1", true},
		{"spiffe://example.com/site/fsn1-site_a", "example.com", "site", "fsn1-site_a", true},
		{"spiffe://example.com/ramdisk/" + strings.Repeat("z", 64), "example.com", "ramdisk", strings.Repeat("z", 64), true},
		{"spiffe://example.com/ramdisk/" + strings.Repeat("z", 65), "", "", "", false},
		{"spiffe://example.com/admin/n1", "", "", "", false},
		{"spiffe://example.com/node/n1/extra", "", "", "", false},
		{"spiffe://example.com/node/", "", "", "", false},
		{"spiffe://example.com/node", "", "", "", false},
		{"spiffe://example.com:443/node/n1", "", "", "", false},
		{"spiffe://user@example.com/node/n1", "", "", "", false},
		{"spiffe://example.com/node/n1?x=1", "", "", "", false},
		{"spiffe://example.com/node/n1#f", "", "", "", false},
		{"spiffe://example.com/node/n%31", "", "", "", false},
		{"spiffe://Example.com/node/n1", "", "", "", false},
		{"SPIFFE://example.com/node/n1", "", "", "", false},
		{"https://example.com/node/n1", "", "", "", false},
		{"spiffe:///node/n1", "", "", "", false},
		{"", "", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			td, role, id, err := ParseSPIFFEID(tt.uri)
			if (err == nil) != tt.ok {
				t.Fatalf("err = %v, want ok=%v", err, tt.ok)
			}
			if td != tt.td || role != tt.role || id != tt.nodeID {
				t.Errorf("= %q %q %q, want %q %q %q", td, role, id, tt.td, tt.role, tt.nodeID)
			}
			if tt.ok && SPIFFEID(td, role, id) != tt.uri {
				t.Errorf("SPIFFEID does not rebuild %q", tt.uri)
			}
		})
	}
}
