package tpmattest

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
)

// EKSHA256 returns the lower-case hex SHA-256 of an endorsement key's PKIX
// (SubjectPublicKeyInfo) DER: the form in which an operator enrolls an EK or lists it
// in an allow-list.
func EKSHA256(ekPKIXDER []byte) string {
	sum := sha256.Sum256(ekPKIXDER)
	return hex.EncodeToString(sum[:])
}

// CheckEKCertificate parses an EK certificate and checks that its public key is the
// endorsement key whose PKIX DER is ekPKIXDER. It does not verify the certificate's
// chain to a TPM manufacturer's CA: a caller that trusts manufacturers verifies the
// returned certificate against their roots itself (EK certificates often carry
// critical extensions, such as the TPM's subject alternative name, that
// x509.Certificate.Verify refuses unless cleared from UnhandledCriticalExtensions).
func CheckEKCertificate(certDER, ekPKIXDER []byte) (*x509.Certificate, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("tpmattest: the EK certificate does not parse: %w", err)
	}
	spki, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("tpmattest: the EK certificate's public key: %w", err)
	}
	if !bytes.Equal(spki, ekPKIXDER) {
		return nil, errors.New("tpmattest: the EK certificate is for another key than the EK")
	}
	return cert, nil
}
