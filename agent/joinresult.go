package agent

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// JoinExpectation is what a signed join (or renewal) answer must be for.
type JoinExpectation struct {
	// CSRSHA256 is the hash of the CSR that was sent.
	CSRSHA256 string
	// Role is the role asked for; NodeID, when set, the node.
	Role, NodeID string
	// Key is the public key of the CSR: the leaf must certify it.
	Key crypto.PublicKey
}

// VerifyJoinResponse checks a JoinResponse as a join and a renewal both do: the
// signed result verifies under the join signing key pinned by signingPin, is for
// the CSR, role and node expected, and its leaf certifies the key, carries the
// SPIFFE id of the result and verifies to the trust bundle. It returns the
// identity the result describes, without key, gateway or times.
func VerifyJoinResponse(resp *protocol.JoinResponse, signingPin string, want JoinExpectation) (*Identity, error) {
	if resp.Signed == "" {
		return nil, errors.New("the answer carries neither a signed result nor a deferral")
	}
	var payload []byte
	if resp.SigningKey != "" {
		pub, err := parsePublicKeyPEM(resp.SigningKey)
		if err != nil {
			return nil, fmt.Errorf("signing_key: %w", err)
		}
		if err := pki.MatchPin(signingPin, pub); err != nil {
			return nil, fmt.Errorf("the join signing key the gateway sent is not the one join_signing_key_pin names: %w", err)
		}
		if payload, err = pki.Verify(pub, protocol.PurposeJoinResponse, resp.Signed); err != nil {
			return nil, err
		}
	} else {
		var err error
		if payload, _, err = pki.VerifyPinned(signingPin, protocol.PurposeJoinResponse, resp.Signed); err != nil {
			return nil, err
		}
	}
	var res protocol.JoinResult
	if err := json.Unmarshal(payload, &res); err != nil {
		return nil, fmt.Errorf("the signed result does not decode: %w", err)
	}
	switch {
	case res.CSRSHA256 != want.CSRSHA256:
		return nil, errors.New("the signed result is for another CSR")
	case res.Role != want.Role:
		return nil, fmt.Errorf("the signed result is for role %q, not %q", res.Role, want.Role)
	case !protocol.ValidNodeID(res.NodeID):
		return nil, fmt.Errorf("the signed result names node %q, not a node id", res.NodeID)
	case want.NodeID != "" && res.NodeID != want.NodeID:
		return nil, fmt.Errorf("the signed result is for node %s, not %s", res.NodeID, want.NodeID)
	}
	chain, err := parsePEMList(res.CertChain)
	if err != nil {
		return nil, fmt.Errorf("cert_chain: %w", err)
	}
	bundle, err := parsePEMList(res.TrustBundle)
	if err != nil {
		return nil, fmt.Errorf("trust_bundle: %w", err)
	}
	leaf := chain[0]
	if !SamePublicKey(want.Key, leaf.PublicKey) {
		return nil, errors.New("the node certificate does not certify this node's key")
	}
	if err := CheckLeafIdentity(leaf, res.SPIFFEID, res.Role, res.NodeID); err != nil {
		return nil, err
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, b := range bundle {
		roots.AddCert(b)
	}
	for _, cert := range chain[1:] {
		inter.AddCert(cert)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("the node certificate does not verify to the trust bundle: %w", err)
	}
	id := &Identity{
		NodeID:      res.NodeID,
		Role:        res.Role,
		Site:        res.Site,
		Pool:        res.Pool,
		SPIFFEID:    res.SPIFFEID,
		CertChain:   EncodeCerts(chain),
		TrustBundle: EncodeCerts(bundle),
	}
	if res.IssuedAt > 0 {
		id.CertIssuedAt = time.Unix(res.IssuedAt, 0).UTC()
	}
	return id, nil
}

func parsePublicKeyPEM(s string) (*ecdsa.PublicKey, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PUBLIC KEY PEM block")
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	ec, ok := k.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, want an ECDSA key", k)
	}
	return ec, nil
}

// parsePEMList reads certificates from a list of PEM strings, each holding one or
// more CERTIFICATE blocks.
func parsePEMList(list []string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for i, s := range list {
		rest := []byte(s)
		n := 0
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				return nil, fmt.Errorf("entry %d: PEM block %q, want CERTIFICATE", i, b.Type)
			}
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("entry %d: %w", i, err)
			}
			certs = append(certs, cert)
			n++
		}
		if n == 0 || len(bytes.TrimSpace(rest)) != 0 {
			return nil, fmt.Errorf("entry %d is not PEM certificates", i)
		}
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs, nil
}
