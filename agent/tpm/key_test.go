package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNodeKey(t *testing.T) {
	sw := startSwtpm(t, false)
	tp := sw.open()
	key, record, err := tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(record), "-----BEGIN BCD TPM NODE KEY-----\n") || !IsRecord(record) {
		t.Fatalf("record is not a BCD TPM NODE KEY:\n%s", record)
	}
	pub := key.Public().(*ecdsa.PublicKey)
	checkSigns(t, key, pub)

	// Closing and reopening the TPM: the record loads the same key.
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := key.Sign(nil, make([]byte, 32), sha256Opts{}); err == nil {
		t.Error("a key signs after its TPM is closed")
	}
	tp = sw.open()
	again, err := tp.LoadNodeKey(record)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Public().(*ecdsa.PublicKey).Equal(pub) {
		t.Fatal("the reloaded key has another public key")
	}
	checkSigns(t, again, pub)
	tp.Close()

	// A restart of the TPM on the same state is a reboot: the owner SRK is
	// re-derived from the seed and the record still loads.
	sw.restart()
	tp = sw.open()
	again, err = tp.LoadNodeKey(record)
	if err != nil {
		t.Fatalf("after the TPM restarted: %v", err)
	}
	checkSigns(t, again, pub)

	// A CSR signed by the TPM key.
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node"}}, again)
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.CheckSignature(); err != nil {
		t.Fatalf("the TPM-signed CSR does not verify: %v", err)
	}
	if !req.PublicKey.(*ecdsa.PublicKey).Equal(pub) {
		t.Fatal("the CSR names another key")
	}

	// Another TPM cannot load the record.
	other := startSwtpm(t, false).open()
	if _, err := other.LoadNodeKey(record); err == nil || !strings.Contains(err.Error(), "TPM2_Load") {
		t.Fatalf("another TPM loading the record: %v, want a TPM2_Load error", err)
	}
}

type sha256Opts struct{}

func (sha256Opts) HashFunc() crypto.Hash { return crypto.SHA256 }

func checkSigns(t *testing.T, key *Key, pub *ecdsa.PublicKey) {
	t.Helper()
	d := sha256.Sum256([]byte("hello"))
	sig, err := key.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(pub, d[:], sig) {
		t.Fatal("the TPM's signature does not verify")
	}
}

// TestNodeKeyTLS has a TLS client authenticate with the TPM key, from several
// handshakes at once (one TPM, one command at a time).
func TestNodeKeyTLS(t *testing.T) {
	tp := startSwtpm(t, false).open()
	key, _, err := tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ca"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IsCA:         true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"server"},
	}
	caDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "node"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}

	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{caDER}, PrivateKey: caKey}},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool,
			MinVersion:   version, MaxVersion: version,
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.(*tls.Conn).Handshake()
					c.Write([]byte("ok"))
				}()
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
					Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}},
					RootCAs:      pool,
					ServerName:   "server",
					MinVersion:   version, MaxVersion: version,
				})
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				b := make([]byte, 2)
				if _, err := io.ReadFull(c, b); err != nil {
					errs <- fmt.Errorf("the server closed on the TPM-authenticated client: %w", err)
				}
			}()
		}
		wg.Wait()
		ln.Close()
		close(errs)
		for err := range errs {
			t.Errorf("TLS %#x: %v", version, err)
		}
	}
}

func TestSignRefuses(t *testing.T) {
	tp := startSwtpm(t, false).open()
	key, _, err := tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := key.Sign(nil, make([]byte, 48), crypto.SHA384); err == nil {
		t.Error("signed a SHA-384 digest")
	}
	if _, err := key.Sign(nil, make([]byte, 20), crypto.SHA256); err == nil {
		t.Error("signed a 20-byte digest as SHA-256")
	}
}
