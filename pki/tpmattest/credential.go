package tpmattest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// EKPublic returns the TPMT_PUBLIC of an endorsement key with public key ekPub: the
// TCG EK profile's default template (RSA 2048, or ECC P-256) carrying the key. The
// template fixes the symmetric algorithm and nameAlg the TPM uses to unwrap a
// credential, so it must be the one the EK was made from.
func EKPublic(ekPub crypto.PublicKey) (tpm2.TPMTPublic, error) {
	switch k := ekPub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() != 2048 {
			return tpm2.TPMTPublic{}, fmt.Errorf("tpmattest: an RSA EK of %d bits, not 2048", k.N.BitLen())
		}
		t := tpm2.RSAEKTemplate
		parms, err := t.Parameters.RSADetail()
		if err != nil {
			return tpm2.TPMTPublic{}, err
		}
		p := *parms
		if k.E != 65537 {
			p.Exponent = uint32(k.E)
		}
		t.Parameters = tpm2.NewTPMUPublicParms(tpm2.TPMAlgRSA, &p)
		t.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: k.N.FillBytes(make([]byte, 256))})
		return t, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return tpm2.TPMTPublic{}, errors.New("tpmattest: an ECC EK not on P-256")
		}
		b, err := k.Bytes()
		if err != nil {
			return tpm2.TPMTPublic{}, fmt.Errorf("tpmattest: the ECC EK: %w", err)
		}
		t := tpm2.ECCEKTemplate
		t.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: b[1:33]},
			Y: tpm2.TPM2BECCParameter{Buffer: b[33:]},
		})
		return t, nil
	}
	return tpm2.TPMTPublic{}, fmt.Errorf("tpmattest: an EK of type %T, not RSA or ECDSA", ekPub)
}

// MakeCredential wraps secret (at most 32 bytes) for the TPM holding the endorsement
// key ekPub, bound to the object named akName: only that TPM, with that object
// loaded, recovers secret with TPM2_ActivateCredential. credBlob is the contents of
// the TPM2B_ID_OBJECT and encSecret of the TPM2B_ENCRYPTED_SECRET. The verifier
// checks akName with ParseAKPublic first; a TPM answers only for an object it holds.
func MakeCredential(ekPub crypto.PublicKey, akName, secret []byte) (credBlob, encSecret []byte, err error) {
	if len(secret) == 0 || len(secret) > 32 {
		return nil, nil, fmt.Errorf("tpmattest: a credential secret of %d bytes, not 1 to 32", len(secret))
	}
	if len(akName) < 2 {
		return nil, nil, errors.New("tpmattest: an empty AK Name")
	}
	t, err := EKPublic(ekPub)
	if err != nil {
		return nil, nil, err
	}
	key, err := tpm2.ImportEncapsulationKey(&t)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmattest: the EK as an encapsulation key: %w", err)
	}
	credBlob, encSecret, err = tpm2.CreateCredential(rand.Reader, key, akName, secret)
	if err != nil {
		return nil, nil, fmt.Errorf("tpmattest: making the credential: %w", err)
	}
	return credBlob, encSecret, nil
}
