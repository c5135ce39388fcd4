package tpm

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"

	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/google/go-tpm/tpm2"
)

// Key is a node key in the TPM: a P-256 ECDSA key under the owner hierarchy's SRK.
// It is a crypto.Signer and safe for concurrent use; it works while its TPM is open.
type Key struct {
	tpm     *TPM
	pub     *ecdsa.PublicKey
	public  []byte // marshalled TPMT_PUBLIC
	private []byte // TPM2B_PRIVATE contents
	record  []byte
}

// CreateNodeKey makes a new node key in the TPM and returns it with its record (see
// NodeKeyPEMType), which LoadNodeKey takes to load it again, after a reboot too.
func (t *TPM) CreateNodeKey() (*Key, []byte, error) {
	if err := t.lock(); err != nil {
		return nil, nil, err
	}
	rsp, err := t.create(tpm2.TPMRHOwner, tpmattest.NodeKeyTemplate(nil))
	t.mu.Unlock()
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: creating the node key: %w", err)
	}
	public := rsp.OutPublic.Bytes()
	pub, err := parsePublic(public)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: creating the node key: the TPM's answer: %w", err)
	}
	k, err := newKey(t, pub, public, rsp.OutPrivate.Buffer)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: creating the node key: %w", err)
	}
	k.record = encodeRecord(NodeKeyPEMType, ownerParent, public, rsp.OutPrivate.Buffer)
	return k, k.record, nil
}

// LoadNodeKey loads the node key whose record CreateNodeKey returned. It checks the
// record and that the TPM takes the key; a record from another TPM, or one made
// before the owner hierarchy was cleared, fails at the TPM2_Load step.
func (t *TPM) LoadNodeKey(record []byte) (*Key, error) {
	pub, public, private, err := decodeRecord(NodeKeyPEMType, ownerParent, record)
	if err != nil {
		return nil, fmt.Errorf("tpm: reading the node key record: %w", err)
	}
	k, err := newKey(t, pub, public, private)
	if err != nil {
		return nil, fmt.Errorf("tpm: reading the node key record: %w", err)
	}
	k.record = bytes.Clone(record)
	// Load it once, so that a record this TPM cannot load fails here and not at
	// the first handshake.
	if err := t.lock(); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	h, err := t.load(tpm2.TPMRHOwner, tpm2.BytesAs2B[tpm2.TPMTPublic](public), tpm2.TPM2BPrivate{Buffer: private})
	if err != nil {
		return nil, fmt.Errorf("tpm: loading the node key: %w", err)
	}
	t.flush(h.ObjectHandle)
	return k, nil
}

// newKey checks that pub is a node key's public area, exactly the one
// tpmattest.NodeKeyTemplate gives for its key, since that is what the verifier
// rebuilds to check a certification.
func newKey(t *TPM, pub *tpm2.TPMTPublic, public, private []byte) (*Key, error) {
	if pub.Type != tpm2.TPMAlgECC {
		return nil, errors.New("the public area is not an ECC key")
	}
	parms, err := pub.Parameters.ECCDetail()
	if err != nil {
		return nil, fmt.Errorf("the public area's ECC parameters: %w", err)
	}
	point, err := pub.Unique.ECC()
	if err != nil {
		return nil, fmt.Errorf("the public area's ECC point: %w", err)
	}
	if parms.CurveID != tpm2.TPMECCNistP256 || len(point.X.Buffer) != 32 || len(point.Y.Buffer) != 32 {
		return nil, errors.New("the public area is not a P-256 key")
	}
	raw := append([]byte{4}, append(bytes.Clone(point.X.Buffer), point.Y.Buffer...)...)
	ek, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, fmt.Errorf("the public area's ECC point: %w", err)
	}
	if !bytes.Equal(tpm2.Marshal(tpmattest.NodeKeyTemplate(ek)), public) {
		return nil, errors.New("the public area is not the node key template's")
	}
	return &Key{tpm: t, pub: ek, public: bytes.Clone(public), private: bytes.Clone(private)}, nil
}

// Public returns the key's *ecdsa.PublicKey.
func (k *Key) Public() crypto.PublicKey { return k.pub }

// Record returns the key's record, the PEM block node.key holds.
func (k *Key) Record() []byte { return bytes.Clone(k.record) }

// TPMTPublic returns the key's marshalled TPMT_PUBLIC.
func (k *Key) TPMTPublic() []byte { return bytes.Clone(k.public) }

// Sign signs digest, a SHA-256 digest (opts.HashFunc() must be crypto.SHA256), with
// TPM2_Sign and returns an ASN.1 DER ECDSA signature, as crypto/ecdsa does. It hashes
// nothing itself. rand is not used: the TPM draws its own nonce.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts == nil || opts.HashFunc() != crypto.SHA256 {
		return nil, errors.New("tpm: signing with the node key: it signs SHA-256 digests only")
	}
	if len(digest) != 32 {
		return nil, fmt.Errorf("tpm: signing with the node key: a digest of %d bytes, not 32", len(digest))
	}
	t := k.tpm
	if err := t.lock(); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	h, err := t.load(tpm2.TPMRHOwner, tpm2.BytesAs2B[tpm2.TPMTPublic](k.public), tpm2.TPM2BPrivate{Buffer: k.private})
	if err != nil {
		return nil, fmt.Errorf("tpm: signing with the node key: %w", err)
	}
	defer t.flush(h.ObjectHandle)
	rsp, err := tpm2.Sign{
		KeyHandle:  tpm2.AuthHandle{Handle: h.ObjectHandle, Name: h.Name, Auth: tpm2.PasswordAuth(nil)},
		Digest:     tpm2.TPM2BDigest{Buffer: digest},
		InScheme:   tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("tpm: signing with the node key: TPM2_Sign: %w", err)
	}
	sig, err := rsp.Signature.Signature.ECDSA()
	if err != nil {
		return nil, fmt.Errorf("tpm: signing with the node key: the TPM's signature: %w", err)
	}
	der, err := asn1.Marshal(struct{ R, S *big.Int }{
		new(big.Int).SetBytes(sig.SignatureR.Buffer),
		new(big.Int).SetBytes(sig.SignatureS.Buffer),
	})
	if err != nil {
		return nil, fmt.Errorf("tpm: signing with the node key: encoding the signature: %w", err)
	}
	return der, nil
}
