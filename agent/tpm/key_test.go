package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
	"testing"
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
