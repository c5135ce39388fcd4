package agent

import (
	"crypto/x509"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
)

func TestVerifyPinnedChain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := pki.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := b.IssueServingCert([]string{"gw.example.com", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	pin := b.Public.ServingCASPKIPin
	now := time.Now()
	if err := VerifyPinnedChain(chain, pin, "gw.example.com", now); err != nil {
		t.Errorf("good chain: %v", err)
	}
	if err := VerifyPinnedChain(chain, pin, "127.0.0.1", now); err != nil {
		t.Errorf("good chain by IP: %v", err)
	}
	if err := VerifyPinnedChain(chain, pin, "other.example.com", now); err == nil {
		t.Error("accepted a certificate for another name")
	}
	if err := VerifyPinnedChain(chain[:1], pin, "gw.example.com", now); !errors.Is(err, pki.ErrPinMismatch) {
		t.Errorf("chain without the CA: %v, want a pin mismatch", err)
	}
	if err := VerifyPinnedChain(chain, pki.CertPin(chain[0]), "gw.example.com", now); err != nil {
		// Pinning the leaf itself also works: the leaf is its own anchor.
		t.Errorf("leaf pin: %v", err)
	}
	if err := VerifyPinnedChain(chain, b.Public.JoinSigningKeyPin, "gw.example.com", now); !errors.Is(err, pki.ErrPinMismatch) {
		t.Errorf("another key's pin: %v", err)
	}
	if err := VerifyPinnedChain(chain, pin, "gw.example.com", now.Add(2*time.Hour)); err == nil {
		t.Error("accepted an expired leaf")
	}
	if _, err := PinnedTLSConfig("sha256/nope", "x"); err == nil {
		t.Error("accepted a malformed pin")
	}
}
