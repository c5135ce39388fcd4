package agent

import (
	"bytes"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Files of an identity under data_dir.
const (
	KeyFile      = "node.key"
	IdentityFile = "identity.json"
	// KeyNextFile is the next key while a renewal runs: written before the
	// request, promoted to node.key once the new certificate is stored.
	KeyNextFile = "node.key.next"
)

// identityVersion is the format of identity.json. A reader takes files of this
// version only, so a future format is refused instead of half understood.
const identityVersion = 1

// MaxIdentitySize bounds identity.json: a chain and a trust bundle of a few
// certificates each fit many times over.
const MaxIdentitySize = 256 << 10

const maxKeySize = 16 << 10

// ErrNotJoined means data_dir holds no identity.json: the machine never joined, or
// its identity was moved aside by bcd join --reset.
var ErrNotJoined = errors.New("not joined")

// Identity is who this machine is to the control plane, as bcd join stored it.
type Identity struct {
	// Version is the identity.json format, 1.
	Version int `json:"version"`
	// NodeID names the node; Role is node, site or ramdisk.
	NodeID string `json:"node_id"`
	Role   string `json:"role"`
	// Site and Pool are where the join placed the node.
	Site string `json:"site,omitempty"`
	Pool string `json:"pool,omitempty"`
	// SPIFFEID is the leaf certificate's URI SAN, spiffe://<td>/<role>/<node>.
	SPIFFEID string `json:"spiffe_id"`
	// CertChain is the node certificate chain in PEM, leaf first.
	CertChain string `json:"cert_chain"`
	// TrustBundle is the node CA and the serving CA in PEM.
	TrustBundle string `json:"trust_bundle"`
	// GatewayURL and ServerName are the gateway the node joined through.
	GatewayURL string `json:"gateway_url"`
	ServerName string `json:"server_name,omitempty"`
	// JoinedAt is when the join answered.
	JoinedAt time.Time `json:"joined_at"`
	// CertIssuedAt is when the control plane issued the certificate (the
	// answer's iat); renewal counts the lifetime from it.
	CertIssuedAt time.Time `json:"cert_issued_at,omitzero"`
	// RenewedAt is when the certificate was last renewed.
	RenewedAt time.Time `json:"renewed_at,omitzero"`
	// Next is a renewal's certificate, stored before node.key.next is promoted
	// (see Renewer): until then CertChain and node.key are still a working pair.
	Next *PendingCert `json:"next,omitempty"`

	key    crypto.Signer
	chain  []*x509.Certificate
	bundle []*x509.Certificate
}

// PendingCert is a renewed certificate for node.key.next, not yet promoted.
type PendingCert struct {
	CertChain    string    `json:"cert_chain"`
	TrustBundle  string    `json:"trust_bundle"`
	CertIssuedAt time.Time `json:"cert_issued_at,omitzero"`
	RenewedAt    time.Time `json:"renewed_at"`
}

// Key is the node's key (nil for an identity that was only decoded). It is a
// crypto.Signer: the key may live in a TPM.
func (id *Identity) Key() crypto.Signer { return id.key }

// Leaf is the node certificate.
func (id *Identity) Leaf() *x509.Certificate { return id.chain[0] }

// Chain is the certificate chain, leaf first.
func (id *Identity) Chain() []*x509.Certificate { return id.chain }

// TrustBundleCerts are the certificates the join returned as the trust bundle.
func (id *Identity) TrustBundleCerts() []*x509.Certificate { return id.bundle }

// TLSCertificate is the node certificate and key for mutual TLS.
func (id *Identity) TLSCertificate() tls.Certificate {
	c := tls.Certificate{PrivateKey: id.key, Leaf: id.chain[0]}
	for _, cert := range id.chain {
		c.Certificate = append(c.Certificate, cert.Raw)
	}
	return c
}

// DecodeIdentity parses identity.json and checks that it is consistent: the chain
// parses, its leaf carries the SPIFFE id, and that id names the node and role. It
// reads no key; LoadIdentity does.
func DecodeIdentity(data []byte) (*Identity, error) {
	if len(data) > MaxIdentitySize {
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte limit", IdentityFile, len(data), MaxIdentitySize)
	}
	var id Identity
	if err := json.Unmarshal(data, &id); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON: %w", IdentityFile, err)
	}
	if id.Version != identityVersion {
		return nil, fmt.Errorf("%s has version %d; this bcd reads version %d", IdentityFile, id.Version, identityVersion)
	}
	if err := id.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", IdentityFile, err)
	}
	return &id, nil
}

func (id *Identity) check() error {
	if !protocol.ValidNodeID(id.NodeID) {
		return fmt.Errorf("node_id %q is not a node id", id.NodeID)
	}
	if !protocol.ValidRole(id.Role) {
		return fmt.Errorf("role %q is not node, site or ramdisk", id.Role)
	}
	chain, err := parseCerts(id.CertChain)
	if err != nil {
		return fmt.Errorf("cert_chain: %w", err)
	}
	bundle, err := parseCerts(id.TrustBundle)
	if err != nil {
		return fmt.Errorf("trust_bundle: %w", err)
	}
	if err := CheckLeafIdentity(chain[0], id.SPIFFEID, id.Role, id.NodeID); err != nil {
		return err
	}
	id.chain, id.bundle = chain, bundle
	return nil
}

// CheckLeafIdentity checks that leaf carries exactly one URI SAN, spiffeID, and that
// it names role and nodeID.
func CheckLeafIdentity(leaf *x509.Certificate, spiffeID, role, nodeID string) error {
	if len(leaf.URIs) != 1 {
		return fmt.Errorf("the node certificate has %d URI names, want one SPIFFE id", len(leaf.URIs))
	}
	got := leaf.URIs[0].String()
	if got != spiffeID {
		return fmt.Errorf("the node certificate is for %s, not %s", got, spiffeID)
	}
	_, r, n, err := pki.ParseSPIFFEID(got)
	if err != nil {
		return err
	}
	if r != role || n != nodeID {
		return fmt.Errorf("the node certificate names %s %s, not %s %s", r, n, role, nodeID)
	}
	return nil
}

// parseCerts reads one or more CERTIFICATE PEM blocks and nothing else.
func parseCerts(s string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := []byte(s)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q, want CERTIFICATE", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("data that is not PEM after the certificates")
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate")
	}
	return certs, nil
}

// EncodeCerts renders certificates as concatenated PEM.
func EncodeCerts(certs []*x509.Certificate) string {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.String()
}

// LoadIdentity reads node.key and identity.json from dataDir, loads the key with
// keys (nil: PKCS8Keys) and checks that it is the one the leaf certifies. A
// data_dir without identity.json gives an error wrapping ErrNotJoined.
func LoadIdentity(dataDir string, keys KeyStore) (*Identity, error) {
	if err := CheckDataDir(dataDir); err != nil {
		return nil, err
	}
	path := filepath.Join(dataDir, IdentityFile)
	id, err := LoadIdentityFiles(path, filepath.Join(dataDir, KeyFile), filepath.Join(dataDir, KeyNextFile), keys)
	if errors.Is(err, fs.ErrNotExist) && !fileExists(path) {
		return nil, fmt.Errorf("%s: %w (no %s)", dataDir, ErrNotJoined, IdentityFile)
	}
	return id, err
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// LoadIdentityFiles is LoadIdentity of an identity under other names: its
// identity.json, node.key and node.key.next (a renewal's key, which may be
// missing) at identityPath, keyPath and keyNextPath. bcd join reads an
// identity that bcd join --reset moved aside with it.
func LoadIdentityFiles(identityPath, keyPath, keyNextPath string, keys KeyStore) (*Identity, error) {
	data, err := readLimited(identityPath, MaxIdentitySize, false)
	if err != nil {
		return nil, err
	}
	id, err := DecodeIdentity(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Dir(identityPath), err)
	}
	if next := loadPending(keyPath, keyNextPath, id, keys); next != nil {
		return next.id, nil
	}
	key, err := loadKey(keyPath, keys)
	if err != nil {
		return nil, err
	}
	if !SamePublicKey(key.Public(), id.Leaf().PublicKey) {
		return nil, fmt.Errorf("%s is not the key the node certificate in %s certifies", keyPath, identityPath)
	}
	id.key = key
	return id, nil
}

// pending is a renewal that stored its certificate but did not finish: id is the
// identity it leads to (the renewed certificate, with its key), keyNext says the
// key is still in node.key.next.
type pending struct {
	id      *Identity
	keyNext bool
}

// loadPending finds the key of the renewed certificate id.Next carries: in
// node.key.next (a crash before the promotion) or already in node.key (a crash
// after it, before identity.json was rewritten). Nil when id has no Next or its
// key is in neither: then CertChain and node.key are the pair.
func loadPending(keyPath, keyNextPath string, id *Identity, keys KeyStore) *pending {
	if id.Next == nil {
		return nil
	}
	next := promoted(id)
	if err := next.check(); err != nil {
		return nil
	}
	for _, c := range []struct {
		path    string
		keyNext bool
	}{{keyNextPath, true}, {keyPath, false}} {
		key, err := loadKey(c.path, keys)
		if err == nil && SamePublicKey(key.Public(), next.Leaf().PublicKey) {
			next.key = key
			return &pending{id: next, keyNext: c.keyNext}
		}
	}
	return nil
}

// promoted is id with its pending certificate made the current one.
func promoted(id *Identity) *Identity {
	next := *id
	next.CertChain, next.TrustBundle = id.Next.CertChain, id.Next.TrustBundle
	next.CertIssuedAt, next.RenewedAt = id.Next.CertIssuedAt, id.Next.RenewedAt
	next.Next, next.key, next.chain, next.bundle = nil, nil, nil, nil
	return &next
}

// loadKey reads a node key file (node.key or node.key.next) and loads it with keys.
func loadKey(path string, keys KeyStore) (crypto.Signer, error) {
	file, err := readLimited(path, maxKeySize, true)
	if err != nil {
		return nil, err
	}
	key, err := keysOr(keys).Load(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return key, nil
}

// SaveIdentity writes node.key (key.File) and identity.json into dataDir (created
// 0700), both 0600 and each atomically. The key goes first: a crash between the
// two leaves an identity that does not load (the key does not match), never a
// certificate whose key is lost.
func SaveIdentity(dataDir string, id *Identity, key *NodeKey) error {
	id.Version = identityVersion
	if err := id.check(); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if key == nil || key.Signer == nil || len(key.File) == 0 {
		return errors.New("save identity: no key")
	}
	if !SamePublicKey(key.Signer.Public(), id.Leaf().PublicKey) {
		return errors.New("save identity: the key is not the one the node certificate certifies")
	}
	if err := CheckDataDir(dataDir); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := pki.WriteFileAtomic(filepath.Join(dataDir, KeyFile), key.File, 0o600); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	if err := writeIdentityFile(dataDir, id); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	// A next key left by an earlier identity's renewal is not this one's.
	if err := os.Remove(filepath.Join(dataDir, KeyNextFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("save identity: %w", err)
	}
	id.key = key.Signer
	return nil
}

// writeIdentityFile writes identity.json (0600) atomically.
func writeIdentityFile(dataDir string, id *Identity) error {
	data, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(filepath.Join(dataDir, IdentityFile), append(data, '\n'), 0o600)
}

// CheckDataDir refuses a data_dir that exists and that group or others may write
// in (systemd's StateDirectoryMode is 0700), naming it and its mode: the node key,
// identity and journal kept there would be anyone's to swap. A missing one passes,
// for the join that creates it 0700.
func CheckDataDir(dataDir string) error {
	if err := secretfile.CheckDir(dataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data_dir %w", err)
	}
	return nil
}

// readLimited reads a regular file of at most limit bytes. private refuses a file
// group or others can access: a key that has been readable is treated as leaked.
// The data directory's files are bcd's own, written in place, so a symbolic link
// there is refused rather than followed.
func readLimited(path string, limit int64, private bool) ([]byte, error) {
	return secretfile.Read(path, secretfile.Options{Limit: limit, Private: private, What: "the node key", NoFollow: true})
}
