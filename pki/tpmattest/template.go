package tpmattest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"errors"

	"github.com/google/go-tpm/tpm2"
)

// NodeKeyTemplate is the public area of a bcd node key: a P-256 ECDSA key with the
// SHA-256 scheme that signs anything (not restricted), decrypts nothing, and was made
// inside its TPM and cannot be duplicated out of it (fixedTPM, fixedParent,
// sensitiveDataOrigin). agent/tpm creates node keys from NodeKeyTemplate(nil); with a
// public key the template carries its point, and its Name is the Name the TPM gave
// the key, which is how VerifyCertify ties a certification to a CSR's public key.
func NodeKeyTemplate(pub *ecdsa.PublicKey) tpm2.TPMTPublic {
	point := tpm2.TPMSECCPoint{}
	if pub != nil {
		if b, err := pub.Bytes(); err == nil && len(b) == 65 {
			point.X.Buffer, point.Y.Buffer = b[1:33], b[33:]
		}
	}
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgECC,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:            true,
			FixedParent:         true,
			SensitiveDataOrigin: true,
			UserWithAuth:        true,
			NoDA:                true,
			SignEncrypt:         true,
		},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{
				Scheme: tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA,
					&tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256}),
			},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &point),
	}
}

// AKTemplate is the public area agent/tpm creates attestation keys from: a restricted
// P-256 ECDSA signing key with the SHA-256 scheme, made in and fixed to its TPM. A
// restricted key signs only digests the TPM computed itself, so it cannot be made to
// sign a forged TPMS_ATTEST.
func AKTemplate() tpm2.TPMTPublic {
	t := NodeKeyTemplate(nil)
	t.ObjectAttributes.Restricted = true
	return t
}

// NodeKeyName returns the TPM Name a node key with public key pub has: nameAlg
// (SHA-256) followed by the SHA-256 of NodeKeyTemplate(pub).
func NodeKeyName(pub *ecdsa.PublicKey) ([]byte, error) {
	if pub == nil || pub.Curve != elliptic.P256() {
		return nil, errors.New("tpmattest: a node key is a P-256 ECDSA key")
	}
	t := NodeKeyTemplate(pub)
	n, err := tpm2.ObjectName(&t)
	if err != nil {
		return nil, err
	}
	return n.Buffer, nil
}
