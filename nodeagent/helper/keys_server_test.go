package helper

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/pki"
)

// TestKeyStoreThroughBcdHelper: the node's KeyStore against the real
// Server (in this process, on swtpm): a node key made in the TPM, loaded
// again from its record, and a TLS 1.3 handshake on loopback whose client
// certificate's key signs through tpm.sign, as the session's mutual TLS does.
func TestKeyStoreThroughBcdHelper(t *testing.T) {
	tr := newTree(t)
	sw := swtpmtest.Start(t, false)
	s, _ := newServer(t, tr)
	s.Keys = &nodekey.Host{RequireTPM: true, OpenTPM: func() (*tpm.TPM, error) { return tpm.OpenTCP(sw.Addr()) }}
	t.Cleanup(func() { s.Keys.Close() })
	served(t, s)
	ks := KeyStore(client(tr))

	made, record, err := ks.New()
	if err != nil {
		t.Fatal(err)
	}
	if !tpm.IsRecord(record) {
		t.Fatalf("node.key's content is not a TPM record: %.60s", record)
	}
	key, err := ks.Load(record)
	if err != nil {
		t.Fatal(err)
	}
	if !agent.SamePublicKey(key.Public(), made.Public()) {
		t.Fatal("the record loads another key")
	}

	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "n_test"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("a certificate signed through tpm.sign: %v", err)
	}
	serverKey, _ := pki.NewP256Key()
	stmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: tmpl.NotBefore, NotAfter: tmpl.NotAfter, DNSNames: []string{"gw"}}
	sder, _ := x509.CreateCertificate(rand.Reader, stmpl, stmpl, &serverKey.PublicKey, serverKey)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{sder}, PrivateKey: serverKey}},
		ClientAuth: tls.RequireAnyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			got <- err
			return
		}
		peer := tc.ConnectionState().PeerCertificates
		if len(peer) != 1 || !peer[0].PublicKey.(*ecdsa.PublicKey).Equal(made.Public()) {
			got <- errTest("the server saw another client key")
			return
		}
		got <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d := tls.Dialer{NetDialer: &net.Dialer{}, Config: &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("the TLS 1.3 handshake with the key in the TPM: %v", err)
	}
	c.Close()
	if err := <-got; err != nil {
		t.Fatalf("the server's side of the handshake: %v", err)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// TestKeyStoreWithoutTPMThroughBcdHelper: a real helper without a TPM
// answers NO_TPM, and the node keeps a PKCS#8 key itself.
func TestKeyStoreWithoutTPMThroughBcdHelper(t *testing.T) {
	tr := newTree(t)
	s, _ := newServer(t, tr)
	s.Keys = &nodekey.Host{Path: filepath.Join(tr.root, "dev/tpmrm0"), RequireTPM: true, Getenv: func(string) string { return "" }}
	served(t, s)
	ks := KeyStore(client(tr))
	key, file, err := ks.New()
	if err != nil {
		t.Fatal(err)
	}
	if tpm.IsRecord(file) {
		t.Fatal("a node key without a TPM is a TPM record")
	}
	loaded, err := ks.Load(file)
	if err != nil || !agent.SamePublicKey(loaded.Public(), key.Public()) {
		t.Fatalf("Load(PKCS#8) = %v", err)
	}
}
