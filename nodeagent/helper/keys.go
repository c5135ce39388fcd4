package helper

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/pki"
)

// SignTimeout bounds one tpm.sign: crypto.Signer's Sign has no context, and a
// TLS handshake or a renewal's CSR must not hang on a helper that stopped
// answering.
const SignTimeout = 15 * time.Second

// KeyStore is the node key of an unprivileged node: bcd node never opens
// /dev/tpmrm0 (spec, 8870b8d), so a key in the TPM is made, loaded and used
// through the helper's tpm.* operations, and node.key holds only its record.
// On a host whose helper has no TPM (CodeNoTPM) the key is a PKCS#8 file the
// node keeps itself, as on a root node without a TPM.
func KeyStore(c *Client) agent.KeyStore { return &keyStore{c: c} }

// KeyStoreWithLogger is KeyStore logging why a new key is not in the TPM.
func KeyStoreWithLogger(c *Client, log *slog.Logger) agent.KeyStore {
	return &keyStore{c: c, log: log}
}

type keyStore struct {
	c   *Client
	log *slog.Logger
}

func (k *keyStore) New() (crypto.Signer, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	r, err := k.c.TPMCreate(ctx)
	switch {
	case IsCode(err, CodeNoTPM):
		if k.log != nil {
			k.log.Info("bcd helper has no TPM: the node key is a PKCS#8 file", "error", err.Error())
		}
		return agent.PKCS8Keys.New()
	case err != nil:
		return nil, nil, fmt.Errorf("make the node key through bcd helper: %w", err)
	case !tpm.IsRecord(r.Record):
		return nil, nil, errors.New("make the node key through bcd helper: tpm.create answered no BCD TPM NODE KEY record")
	}
	s, err := newRemoteSigner(k.c, r.Record, r.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("make the node key through bcd helper: %w", err)
	}
	return s, r.Record, nil
}

func (k *keyStore) Load(file []byte) (crypto.Signer, error) {
	if !tpm.IsRecord(file) {
		return pki.ParsePKCS8PEM(file)
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	pub, err := k.c.TPMLoad(ctx, file)
	if err != nil {
		return nil, fmt.Errorf("node.key is a TPM key's record; bcd helper does not load it: %w", err)
	}
	s, err := newRemoteSigner(k.c, file, pub)
	if err != nil {
		return nil, fmt.Errorf("node.key is a TPM key's record: %w", err)
	}
	return s, nil
}

// remoteSigner is a node key in the TPM that signs through tpm.sign.
type remoteSigner struct {
	c      *Client
	record []byte
	pub    *ecdsa.PublicKey
}

func newRemoteSigner(c *Client, record, pkix []byte) (*remoteSigner, error) {
	pub, err := x509.ParsePKIXPublicKey(pkix)
	if err != nil {
		return nil, fmt.Errorf("bcd helper's public_key does not parse as PKIX DER: %w", err)
	}
	ec, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("bcd helper's public_key is a %T, not the ECDSA key a TPM node key is", pub)
	}
	return &remoteSigner{c: c, record: record, pub: ec}, nil
}

func (s *remoteSigner) Public() crypto.PublicKey { return s.pub }

// Sign signs a SHA-256 digest with the TPM through the helper, the one hash a
// TPM node key signs (tpm.Key.Sign). The signature is checked against the
// public key before it is used, so a helper answering for another key fails
// here rather than in the peer's handshake.
func (s *remoteSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts == nil || opts.HashFunc() != crypto.SHA256 {
		h := "no hash"
		if opts != nil {
			h = opts.HashFunc().String()
		}
		return nil, fmt.Errorf("bcd helper: signing with the node key: it signs SHA-256 digests only, not %s", h)
	}
	if len(digest) != crypto.SHA256.Size() {
		return nil, fmt.Errorf("bcd helper: signing with the node key: a digest of %d bytes, not %d", len(digest), crypto.SHA256.Size())
	}
	ctx, cancel := context.WithTimeout(context.Background(), SignTimeout)
	defer cancel()
	sig, err := s.c.TPMSign(ctx, s.record, digest, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("signing with the node key: %w", err)
	}
	if !ecdsa.VerifyASN1(s.pub, digest, sig) {
		return nil, errors.New("signing with the node key: bcd helper's tpm.sign answered a signature the node key's public key does not verify")
	}
	return sig, nil
}
