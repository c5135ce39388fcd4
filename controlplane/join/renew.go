package join

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Renewal is a certificate renewal as the gateway hands it over: the node its
// client certificate names (the certificate verified against the node CA, so the
// TLS handshake proved the current key) and what it asked.
type Renewal struct {
	NodeID, Role string
	// Serial is the presented certificate's serial in hex, as
	// store.Node.CertSerial keeps it.
	Serial string
	// Request carries the CSR of the next key.
	Request *protocol.RenewRequest
}

// DecodeRenewRequest reads a RenewRequest of at most protocol.MaxJoinRequestSize
// bytes, refusing unknown fields and trailing data (INVALID_INPUT).
func DecodeRenewRequest(r io.Reader) (*protocol.RenewRequest, error) {
	var req protocol.RenewRequest
	if err := httpjson.Decode(r, protocol.MaxJoinRequestSize, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// Renew certifies the next key of a node that proved its current one. It refuses
// a deleted or unknown node (NODE_REVOKED), a certificate that is not the node's
// current one (CERT_REPLACED: a later join or renewal replaced it) and a CSR that
// does not parse (INVALID_INPUT). One exception keeps a node whose answer was
// lost alive: the certificate the last renewal replaced may ask again for the
// very key that renewal certified. The new certificate becomes the node's in one
// store write; the answer is signed like a join's.
func (s *Service) Renew(ctx context.Context, r Renewal) (*protocol.JoinResponse, error) {
	if r.Request == nil {
		return nil, refuse(protocol.CodeInvalidInput, "no renewal request")
	}
	if r.Request.ProtocolVersion < protocol.MinVersion {
		return nil, refuse(protocol.CodeUnsupported, "protocol version %d is older than this control plane's minimum %d", r.Request.ProtocolVersion, protocol.MinVersion)
	}
	csr, err := pki.ParseCSRPEM([]byte(r.Request.CSR))
	if err != nil {
		return nil, refuse(protocol.CodeInvalidInput, "the renewal's CSR does not parse: %v", err)
	}
	keySHA := KeySHA256(csr.RawSubjectPublicKeyInfo)
	node, err := s.Store.GetNode(ctx, r.NodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, refuse(protocol.CodeNodeRevoked, "node %s is not known to this control plane; to join again: bcd join --reset --yes, then bcd join", r.NodeID)
	case err != nil:
		return nil, err
	case node.Deleted():
		return nil, refuse(protocol.CodeNodeRevoked, "node %s was deleted, its certificate is not renewed; to join again: bcd join --reset --yes, then bcd join", r.NodeID)
	case node.Role != r.Role:
		return nil, refuse(protocol.CodeNodeRevoked, "node %s has role %s, the certificate says %s", r.NodeID, node.Role, r.Role)
	}
	retry := false
	switch {
	case r.Serial == node.CertSerial:
	case r.Serial != "" && r.Serial == node.PrevCertSerial && keySHA == node.CertKeySHA256:
		retry = true
	default:
		return nil, refuse(protocol.CodeCertReplaced, "this certificate of node %s was replaced by a later join or renewal; it cannot renew", r.NodeID)
	}
	der, err := s.Bundle.IssueNodeCert(csr, node.Role, node.ID, s.certTTL())
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	now := s.now()
	err = s.Store.RenewNodeCert(ctx, store.CertRenewal{
		NodeID: node.ID, Replaces: node.CertSerial, Presented: r.Serial,
		Serial: leaf.SerialNumber.Text(16), NotAfter: leaf.NotAfter, KeySHA256: keySHA, At: now,
	})
	switch {
	case errors.Is(err, store.ErrNodeDeleted), errors.Is(err, store.ErrNotFound):
		return nil, refuse(protocol.CodeNodeRevoked, "node %s was deleted while it renewed; to join again: bcd join --reset --yes, then bcd join", node.ID)
	case errors.Is(err, store.ErrCertReplaced):
		return nil, refuse(protocol.CodeCertReplaced, "the certificate of node %s was replaced while it renewed", node.ID)
	case err != nil:
		return nil, err
	}
	resp, err := s.sign(protocol.JoinResult{
		ProtocolVersion: protocol.Version,
		NodeID:          node.ID,
		Role:            node.Role,
		Site:            node.Site,
		Pool:            node.Pool,
		SPIFFEID:        pki.SPIFFEID(s.Bundle.Public.TrustDomain, node.Role, node.ID),
		CSRSHA256:       pki.CSRSHA256(csr.Raw),
		CertChain:       []string{string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), s.Bundle.Public.NodeCAPEM},
		TrustBundle:     []string{s.Bundle.Public.NodeCAPEM, s.Bundle.Public.ServingCAPEM},
		IssuedAt:        now.Unix(),
	})
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	s.log().Info("node certificate renewed", "node", node.ID, "role", node.Role, "from_serial", r.Serial,
		"cert_serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter, "retry", retry)
	return resp, nil
}
