package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

const (
	pemPrivateKey = "PRIVATE KEY"
	pemPublicKey  = "PUBLIC KEY"
	pemCert       = "CERTIFICATE"
	pemCSR        = "CERTIFICATE REQUEST"
)

// MarshalPKCS8PEM encodes a private key as a PKCS#8 "PRIVATE KEY" PEM block,
// the form openssl and every TLS stack read.
func MarshalPKCS8PEM(key crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal PKCS#8 private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParsePKCS8PEM decodes exactly one PKCS#8 "PRIVATE KEY" PEM block holding a
// P-256 ECDSA key, the only kind bcd makes. The error never quotes the input.
func ParsePKCS8PEM(data []byte) (*ecdsa.PrivateKey, error) {
	der, err := decodeOnePEM(data, pemPrivateKey)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errors.New("not a valid PKCS#8 private key")
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("private key is %T, want ECDSA P-256", k)
	}
	return ec, nil
}

// decodeOnePEM returns the bytes of the only PEM block in data, which must be
// of type typ. Trailing blocks are refused so that a file cannot carry a second
// key or certificate that one reader uses and another ignores.
func decodeOnePEM(data []byte, typ string) ([]byte, error) {
	b, rest := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("no %s PEM block", typ)
	}
	if b.Type != typ {
		return nil, fmt.Errorf("PEM block is %q, want %q", b.Type, typ)
	}
	if len(b.Headers) != 0 {
		return nil, fmt.Errorf("%s PEM block has headers (encrypted keys are not supported)", typ)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("unexpected data after the %s PEM block", typ)
	}
	return b.Bytes, nil
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCert, Bytes: der})
}

func parseCertPEM(data []byte) (*x509.Certificate, error) {
	der, err := decodeOnePEM(data, pemCert)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func publicKeyPEM(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPublicKey, Bytes: der}), nil
}

func parsePublicKeyPEM(data []byte) (*ecdsa.PublicKey, error) {
	der, err := decodeOnePEM(data, pemPublicKey)
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, err
	}
	return asP256(k)
}

// asP256 narrows a public key to ECDSA P-256, the only curve in bcd's PKI.
func asP256(k crypto.PublicKey) (*ecdsa.PublicKey, error) {
	ec, ok := k.(*ecdsa.PublicKey)
	if !ok || ec == nil {
		return nil, fmt.Errorf("public key is %T, want ECDSA P-256", k)
	}
	if ec.Curve != elliptic.P256() {
		name := "no curve"
		if ec.Curve != nil {
			name = ec.Curve.Params().Name
		}
		return nil, fmt.Errorf("public key is on %s, want P-256", name)
	}
	return ec, nil
}
