package nodekey

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/better-compute/bcd/protocol"
)

// TestHostWithoutTPM: no device means a PKCS#8 key, unless the join needs the
// TPM, which then stops naming it; EKClaim is empty.
func TestHostWithoutTPM(t *testing.T) {
	h := &Host{Path: filepath.Join(t.TempDir(), "tpmrm0")}
	key, file, err := h.New()
	if err != nil || !strings.HasPrefix(string(file), "-----BEGIN PRIVATE KEY-----") {
		t.Fatalf("New without a TPM: %v\n%s", err, file)
	}
	if _, ok := key.(*ecdsa.PrivateKey); !ok {
		t.Errorf("key %T, want a PKCS#8 ECDSA key", key)
	}
	if again, err := h.Load(file); err != nil || !again.Public().(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Errorf("Load: %v", err)
	}
	if ek, err := h.EKClaim(); err != nil || ek != "" {
		t.Errorf("EKClaim without a TPM: %q %v", ek, err)
	}
	need := &Host{Path: h.Path, RequireTPM: true}
	if _, _, err := need.New(); err == nil || !errors.Is(err, ErrNoTPM) || !strings.Contains(err.Error(), "must be made in the TPM") {
		t.Errorf("RequireTPM without a TPM: %v", err)
	}
	if _, err := h.Load([]byte("-----BEGIN BCD TPM NODE KEY-----\nVersion: 1\n\nAAAA\n-----END BCD TPM NODE KEY-----\n")); err == nil ||
		!strings.Contains(err.Error(), "the TPM does not open") {
		t.Errorf("a TPM record without a TPM: %v", err)
	}
}

// TestHostWithSWTPM: with a TPM the node key is made in it (node.key is its
// record), loads again, and gives the tpm attestor evidence that verifies and
// answers a challenge made for its EK; a TPM that stops working stops a join
// that needs it with the TPM step, and a token join falls back to PKCS#8.
func TestHostWithSWTPM(t *testing.T) {
	sw := swtpmtest.Start(t, false)
	h := &Host{RequireTPM: true, OpenTPM: func() (*tpm.TPM, error) { return tpm.OpenTCP(sw.Addr()) }}
	t.Cleanup(func() { h.Close() })
	key, record, err := h.New()
	if err != nil || !tpm.IsRecord(record) {
		t.Fatalf("New: %v\n%s", err, record)
	}
	if _, ok := key.(*tpm.Key); !ok {
		t.Fatalf("key %T, want a TPM key", key)
	}
	loaded, err := h.Load(record)
	if err != nil || !loaded.Public().(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Fatalf("Load: %v", err)
	}
	claim, err := h.EKClaim()
	if err != nil || !strings.HasPrefix(claim, "-----BEGIN PUBLIC KEY-----") {
		t.Fatalf("EKClaim: %q %v", claim, err)
	}
	csr := sha256.Sum256([]byte("a CSR's DER"))
	ev, err := h.Evidence(key, csr[:])
	if err != nil {
		t.Fatal(err)
	}
	dec := func(s string) []byte {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if err := tpmattest.VerifyCertify(dec(ev.AKPublic), dec(ev.CertifyInfo), dec(ev.CertifySignature), key.Public(), csr[:]); err != nil {
		t.Errorf("the evidence does not verify: %v", err)
	}
	ekPub, err := parsePublicPEM(claim)
	if err != nil {
		t.Fatal(err)
	}
	_, akName, err := tpmattest.ParseAKPublic(dec(ev.AKPublic))
	if err != nil {
		t.Fatal(err)
	}
	blob, enc, err := tpmattest.MakeCredential(ekPub, akName, []byte("the challenge's secret, 32 bytes"))
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	secret, err := h.Activate(&protocol.TPMChallenge{CredentialBlob: b64(blob), EncryptedSecret: b64(enc)})
	if err != nil || string(secret) != "the challenge's secret, 32 bytes" {
		t.Errorf("Activate: %q %v", secret, err)
	}

	// The TPM goes away: a tpm join cannot make its key and says which TPM
	// step failed; a token join falls back to PKCS#8.
	sw.Stop()
	if _, _, err := h.New(); err == nil || !strings.Contains(err.Error(), "must be made in the TPM") || !strings.Contains(err.Error(), "tpm: ") {
		t.Errorf("RequireTPM with a dead TPM: %v", err)
	}
	h.RequireTPM = false
	if _, file, err := h.New(); err != nil || !strings.HasPrefix(string(file), "-----BEGIN PRIVATE KEY-----") {
		t.Errorf("token join with a dead TPM: %v", err)
	}
}

// parsePublicPEM parses a PEM public key as the claims carry it.
func parsePublicPEM(s string) (crypto.PublicKey, error) {
	blk, _ := pem.Decode([]byte(s))
	if blk == nil {
		return nil, errors.New("not PEM")
	}
	return x509.ParsePKIXPublicKey(blk.Bytes)
}
