package tpm

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// rsaEKCertIndex is the NV index of the RSA 2048 EK certificate (TCG EK Credential
// Profile, "Low Range").
const rsaEKCertIndex = 0x01c00002

// EK is a TPM's endorsement key, from the TCG EK profile's default RSA 2048
// template.
type EK struct {
	// Public is the EK's public key, an *rsa.PublicKey.
	Public crypto.PublicKey
	// PKIX is Public as PKIX (SubjectPublicKeyInfo) DER, the form
	// tpmattest.EKSHA256 hashes.
	PKIX []byte
	// Certificate is the EK certificate's DER, from NV index 0x01c00002, or nil
	// when the TPM has none there.
	Certificate []byte
}

// EK derives the endorsement key and reads its certificate, if the TPM has one.
func (t *TPM) EK() (EK, error) {
	if err := t.lock(); err != nil {
		return EK{}, err
	}
	defer t.mu.Unlock()
	handle, ek, err := t.ek()
	if err != nil {
		return EK{}, fmt.Errorf("tpm: deriving the endorsement key: %w", err)
	}
	t.flush(handle)
	pubArea, err := ek.public.Contents()
	if err != nil {
		return EK{}, fmt.Errorf("tpm: deriving the endorsement key: its public area: %w", err)
	}
	pub, err := tpm2.Pub(*pubArea)
	if err != nil {
		return EK{}, fmt.Errorf("tpm: deriving the endorsement key: its public key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return EK{}, fmt.Errorf("tpm: deriving the endorsement key: %w", err)
	}
	cert, err := readNV(t.t, rsaEKCertIndex)
	if err != nil {
		return EK{}, fmt.Errorf("tpm: reading the EK certificate: %w", err)
	}
	return EK{Public: pub, PKIX: der, Certificate: trimDER(cert)}, nil
}

// ek loads the EK; the caller flushes it. Call with t.mu held.
func (t *TPM) ek() (tpm2.TPMHandle, *primary, error) {
	return t.loadPrimary("endorsement/ek-rsa2048", tpm2.TPMRHEndorsement, tpm2.RSAEKTemplate)
}

// readNV reads an NV index whole, or returns nil when it is not defined.
func readNV(t transport.TPM, index tpm2.TPMHandle) ([]byte, error) {
	pub, err := tpm2.NVReadPublic{NVIndex: index}.Execute(t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCHandle) {
			return nil, nil
		}
		return nil, fmt.Errorf("TPM2_NV_ReadPublic: %w", err)
	}
	nv, err := pub.NVPublic.Contents()
	if err != nil {
		return nil, fmt.Errorf("TPM2_NV_ReadPublic: %w", err)
	}
	const chunk = 512 // below every TPM's MAX_NV_BUFFER_SIZE
	var out []byte
	for off := 0; off < int(nv.DataSize); off += chunk {
		n := min(chunk, int(nv.DataSize)-off)
		rsp, err := tpm2.NVRead{
			AuthHandle: tpm2.AuthHandle{Handle: index, Name: pub.NVName, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    tpm2.NamedHandle{Handle: index, Name: pub.NVName},
			Size:       uint16(n),
			Offset:     uint16(off),
		}.Execute(t)
		if err != nil {
			return nil, fmt.Errorf("TPM2_NV_Read: %w", err)
		}
		out = append(out, rsp.Data.Buffer...)
	}
	return out, nil
}

// trimDER cuts the padding some TPMs leave after a certificate in NV.
func trimDER(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	var raw asn1.RawValue
	if rest, err := asn1.Unmarshal(b, &raw); err == nil {
		return b[:len(b)-len(rest)]
	}
	return b
}

// AK is an attestation key: a restricted P-256 signing key
// (tpmattest.AKTemplate) under the endorsement hierarchy's SRK. It signs only what
// the TPM itself produced, such as a certification of a node key.
type AK struct {
	tpm     *TPM
	public  []byte
	private []byte
	name    []byte
	record  []byte
}

// TPMTPublic returns the AK's marshalled TPMT_PUBLIC, what tpmattest.ParseAKPublic
// takes.
func (a *AK) TPMTPublic() []byte { return bytes.Clone(a.public) }

// Name returns the AK's TPM Name, what a credential is bound to.
func (a *AK) Name() []byte { return bytes.Clone(a.name) }

// Record returns the AK's record (PEM type AKPEMType), for LoadAK: a join that
// waits for the control plane's credential challenge can keep it in between.
func (a *AK) Record() []byte { return bytes.Clone(a.record) }

// CreateAK makes a new attestation key.
func (t *TPM) CreateAK() (*AK, error) {
	if err := t.lock(); err != nil {
		return nil, err
	}
	rsp, err := t.create(tpm2.TPMRHEndorsement, tpmattest.AKTemplate())
	t.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("tpm: creating the attestation key: %w", err)
	}
	a, err := t.newAK(rsp.OutPublic.Bytes(), rsp.OutPrivate.Buffer)
	if err != nil {
		return nil, fmt.Errorf("tpm: creating the attestation key: %w", err)
	}
	return a, nil
}

// LoadAK loads an attestation key from the record AK.Record returned.
func (t *TPM) LoadAK(record []byte) (*AK, error) {
	_, public, private, err := decodeRecord(AKPEMType, endorseParent, record)
	if err != nil {
		return nil, fmt.Errorf("tpm: reading the attestation key record: %w", err)
	}
	a, err := t.newAK(public, private)
	if err != nil {
		return nil, fmt.Errorf("tpm: reading the attestation key record: %w", err)
	}
	if err := t.lock(); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	h, err := a.load()
	if err != nil {
		return nil, fmt.Errorf("tpm: loading the attestation key: %w", err)
	}
	t.flush(h.ObjectHandle)
	return a, nil
}

func (t *TPM) newAK(public, private []byte) (*AK, error) {
	_, name, err := tpmattest.ParseAKPublic(public)
	if err != nil {
		return nil, err
	}
	return &AK{
		tpm:     t,
		public:  bytes.Clone(public),
		private: bytes.Clone(private),
		name:    name,
		record:  encodeRecord(AKPEMType, endorseParent, public, private),
	}, nil
}

// load loads the AK; the caller flushes it. Call with a.tpm.mu held.
func (a *AK) load() (*tpm2.LoadResponse, error) {
	return a.tpm.load(tpm2.TPMRHEndorsement, tpm2.BytesAs2B[tpm2.TPMTPublic](a.public), tpm2.TPM2BPrivate{Buffer: a.private})
}

// Certify has ak certify key with TPM2_Certify, qualifyingData (the verifier's
// nonce) included, and returns the marshalled TPMS_ATTEST and TPMT_SIGNATURE, what
// tpmattest.VerifyCertify checks. Both keys must be of t.
func (t *TPM) Certify(key *Key, ak *AK, qualifyingData []byte) (attest, signature []byte, err error) {
	if key.tpm != t || ak.tpm != t {
		return nil, nil, errors.New("tpm: certifying the node key: the keys are of another TPM")
	}
	if err := t.lock(); err != nil {
		return nil, nil, err
	}
	defer t.mu.Unlock()
	k, err := t.load(tpm2.TPMRHOwner, tpm2.BytesAs2B[tpm2.TPMTPublic](key.public), tpm2.TPM2BPrivate{Buffer: key.private})
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: certifying the node key: loading it: %w", err)
	}
	defer t.flush(k.ObjectHandle)
	a, err := ak.load()
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: certifying the node key: loading the attestation key: %w", err)
	}
	defer t.flush(a.ObjectHandle)
	rsp, err := tpm2.Certify{
		ObjectHandle:   tpm2.AuthHandle{Handle: k.ObjectHandle, Name: k.Name, Auth: tpm2.PasswordAuth(nil)},
		SignHandle:     tpm2.AuthHandle{Handle: a.ObjectHandle, Name: a.Name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: qualifyingData},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
	}.Execute(t.t)
	if err != nil {
		return nil, nil, fmt.Errorf("tpm: certifying the node key: TPM2_Certify: %w", err)
	}
	return bytes.Clone(rsp.CertifyInfo.Bytes()), tpm2.Marshal(rsp.Signature), nil
}

// ActivateCredential answers the verifier's credential challenge (from
// tpmattest.MakeCredential): the EK unwraps credBlob and encSecret, which the TPM
// does only if they were made for its EK and ak's Name, and returns the secret. The
// EK's policy is satisfied with TPM2_PolicySecret on the endorsement hierarchy.
func (t *TPM) ActivateCredential(ak *AK, credBlob, encSecret []byte) ([]byte, error) {
	if ak.tpm != t {
		return nil, errors.New("tpm: activating the credential: the attestation key is of another TPM")
	}
	if err := t.lock(); err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	ekHandle, ek, err := t.ek()
	if err != nil {
		return nil, fmt.Errorf("tpm: activating the credential: deriving the endorsement key: %w", err)
	}
	defer t.flush(ekHandle)
	a, err := ak.load()
	if err != nil {
		return nil, fmt.Errorf("tpm: activating the credential: loading the attestation key: %w", err)
	}
	defer t.flush(a.ObjectHandle)
	policy := tpm2.Policy(tpm2.TPMAlgSHA256, 16, func(tp transport.TPM, s tpm2.TPMISHPolicy, nonce tpm2.TPM2BNonce) error {
		_, err := tpm2.PolicySecret{
			AuthHandle:    tpm2.AuthHandle{Handle: tpm2.TPMRHEndorsement, Auth: tpm2.PasswordAuth(nil)},
			PolicySession: s,
			NonceTPM:      nonce,
		}.Execute(tp)
		return err
	})
	rsp, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: a.ObjectHandle, Name: a.Name, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: ekHandle, Name: ek.name, Auth: policy},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: credBlob},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: encSecret},
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("tpm: activating the credential: TPM2_ActivateCredential: %w", err)
	}
	return bytes.Clone(rsp.CertInfo.Buffer), nil
}
