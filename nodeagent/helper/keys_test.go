package helper

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/pki"
)

func openSWTPM(t *testing.T) *tpm.TPM {
	t.Helper()
	sw := swtpmtest.Start(t, false)
	tp, err := tpm.OpenTCP(sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

// TestKeyStoreTPM: a node key made, loaded and used through the helper's
// tpm.* operations (a stand-in over a real swtpm): node.key is the record, the
// signer's public key is the TPM key's, a CSR the signer makes verifies, and
// tpm.sign receives a 32-byte SHA-256 digest; a hash the TPM key cannot sign
// fails before any request.
func TestKeyStoreTPM(t *testing.T) {
	s := newStandIn(t, openSWTPM(t))
	ks := KeyStore(s.client())
	key, file, err := ks.New()
	if err != nil {
		t.Fatal(err)
	}
	if !tpm.IsRecord(file) {
		t.Fatalf("node.key content is not a TPM record: %.60s", file)
	}
	if _, ok := key.Public().(*ecdsa.PublicKey); !ok {
		t.Fatalf("public key %T", key.Public())
	}
	// A CSR, as the join and a renewal make one: x509 signs through Sign.
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n_test"}}, key)
	if err != nil {
		t.Fatalf("CSR with the remote signer: %v", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil || csr.CheckSignature() != nil {
		t.Fatalf("the CSR does not verify: %v %v", err, csr.CheckSignature())
	}
	signs := s.requests(OpTPMSign)
	if len(signs) != 1 {
		t.Fatalf("%d tpm.sign requests, want 1", len(signs))
	}
	var req TPMSignRequest
	if err := json.Unmarshal(signs[0], &req); err != nil {
		t.Fatal(err)
	}
	if len(req.Digest) != 32 || req.Hash != "SHA-256" || !bytes.Equal(req.Record, file) {
		t.Errorf("tpm.sign got a %d-byte digest, hash %q, record same=%v", len(req.Digest), req.Hash, bytes.Equal(req.Record, file))
	}

	// node.key read back: tpm.load, then the same key.
	loaded, err := ks.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if !agent.SamePublicKey(loaded.Public(), key.Public()) {
		t.Error("the loaded key is not the one made")
	}
	if n := len(s.requests(OpTPMLoad)); n != 1 {
		t.Errorf("%d tpm.load requests, want 1", n)
	}
	digest := sha256.Sum256([]byte("a TLS handshake's transcript"))
	sig, err := loaded.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil || !ecdsa.VerifyASN1(key.Public().(*ecdsa.PublicKey), digest[:], sig) {
		t.Fatalf("Sign = %v, or the signature does not verify", err)
	}

	before := s.count()
	for _, c := range []struct {
		opts   crypto.SignerOpts
		digest []byte
		want   string
	}{
		{nil, digest[:], "not no hash"},
		{crypto.SHA384, make([]byte, 48), "SHA-256 digests only, not SHA-384"},
		{crypto.SHA256, digest[:20], "a digest of 20 bytes, not 32"},
	} {
		if _, err := loaded.Sign(rand.Reader, c.digest, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Sign(%v, %d bytes) = %v, want %q", c.opts, len(c.digest), err, c.want)
		}
	}
	if s.count() != before {
		t.Error("a digest the TPM key cannot sign was sent to the helper")
	}
}

// TestKeyStoreNoTPM: a helper without a TPM (NO_TPM) leaves the node a PKCS#8
// key of its own, which loads without the helper.
func TestKeyStoreNoTPM(t *testing.T) {
	s := newStandIn(t, nil)
	ks := KeyStore(s.client())
	key, file, err := ks.New()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(file, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Fatalf("node.key without a TPM is not PKCS#8: %.40s", file)
	}
	before := s.count()
	loaded, err := ks.Load(file)
	if err != nil || !agent.SamePublicKey(loaded.Public(), key.Public()) {
		t.Fatalf("Load(PKCS#8) = %v", err)
	}
	if s.count() != before {
		t.Error("loading a PKCS#8 node.key asked the helper")
	}
}

// TestKeyStoreRefusals: a helper error is not turned into a local key, and a
// signature that the node key's public key does not verify is refused.
func TestKeyStoreRefusals(t *testing.T) {
	s := newStandIn(t, openSWTPM(t))
	ks := KeyStore(s.client())
	key, file, err := ks.New()
	if err != nil {
		t.Fatal(err)
	}

	s.on(OpTPMCreate, func([]byte) (int, any) {
		return http.StatusForbidden, Error{Code: CodePeerRefused, Message: "not an installed bcd"}
	})
	if _, _, err := ks.New(); !IsCode(err, CodePeerRefused) || !strings.Contains(err.Error(), "make the node key through bcd helper") {
		t.Errorf("New with a refusing helper = %v, want HELPER_PEER_REFUSED", err)
	}
	s.on(OpTPMLoad, func([]byte) (int, any) {
		return http.StatusForbidden, Error{Code: CodePeerRefused, Message: "not an installed bcd"}
	})
	if _, err := ks.Load(file); !IsCode(err, CodePeerRefused) || !strings.Contains(err.Error(), "does not load it") {
		t.Errorf("Load with a refusing helper = %v", err)
	}

	other, _ := pki.NewP256Key()
	s.on(OpTPMSign, func(body []byte) (int, any) {
		var req TPMSignRequest
		json.Unmarshal(body, &req)
		sig, _ := ecdsa.SignASN1(rand.Reader, other, req.Digest)
		return http.StatusOK, TPMSignResponse{Signature: sig}
	})
	d := sha256.Sum256([]byte("x"))
	if _, err := key.Sign(rand.Reader, d[:], crypto.SHA256); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("Sign with another key's signature = %v", err)
	}
}
