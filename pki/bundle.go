package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/internal/secretfile"
)

// Files of a bundle directory.
const (
	ServingCAKeyFile      = "serving-ca.key"
	ServingCACertFile     = "serving-ca.crt"
	JoinSigningKeyFile    = "join-signing.key"
	JoinEncryptionKeyFile = "join-encryption.key"
	JoinEncryptionJWKFile = "join-encryption.jwk"
	NodeCAKeyFile         = "node-ca.key"
	NodeCACertFile        = "node-ca.crt"
	PublicFile            = "public.json"
)

// publicVersion is the format of public.json; a reader refuses others rather
// than guess at fields it does not know.
const publicVersion = 1

// File modes: the directory and private keys are the owner's alone; the
// certificates, the JWK and public.json are meant to be handed out.
const (
	dirMode     os.FileMode = 0o700
	privateMode os.FileMode = 0o600
	publicMode  os.FileMode = 0o644
)

const (
	maxKeyFile    = 16 << 10
	maxPublicFile = 256 << 10
)

// ErrBundleExists is returned by Init when dir already holds something.
var ErrBundleExists = errors.New("PKI bundle directory is not empty")

// InitOptions configures Init.
type InitOptions struct {
	// TrustDomain is the host part of every node's SPIFFE ID; empty means
	// DefaultTrustDomain.
	TrustDomain string
}

// Public is the half of the bundle that may be shared: public.json. It is all
// the install-script generator and the well-known document need.
type Public struct {
	// Version is the public.json format, 1.
	Version int `json:"version"`
	// TrustDomain is the host part of node SPIFFE IDs.
	TrustDomain string `json:"trust_domain"`
	// ServingCASPKIPin pins the serving CA (config.toml serving_ca_spki_pin).
	ServingCASPKIPin string `json:"serving_ca_spki_pin"`
	// JoinSigningKeyPin pins the join signing key (join_signing_key_pin).
	JoinSigningKeyPin string `json:"join_signing_key_pin"`
	// JoinEncryptionKeyPin pins the join encryption key (join_encryption_key_pin).
	JoinEncryptionKeyPin string `json:"join_encryption_key_pin"`
	// JoinEncryptionJWK is the join encryption public key as a JWK object,
	// the content of join-encryption.jwk.
	JoinEncryptionJWK json.RawMessage `json:"join_encryption_jwk"`
	// ServingCAPEM is the serving CA certificate.
	ServingCAPEM string `json:"serving_ca_pem"`
	// NodeCAPEM is the node CA certificate, the trust bundle for node
	// certificates.
	NodeCAPEM string `json:"node_ca_pem"`
	// JoinSigningPublicPEM is the join signing public key (PKIX PEM).
	JoinSigningPublicPEM string `json:"join_signing_public_pem"`

	servingCA      *x509.Certificate
	nodeCA         *x509.Certificate
	joinSigning    *ecdsa.PublicKey
	joinEncryption *ecdsa.PublicKey
}

// Pins returns the three bootstrap pins.
func (p *Public) Pins() Pins {
	return Pins{
		ServingCA:      p.ServingCASPKIPin,
		JoinSigning:    p.JoinSigningKeyPin,
		JoinEncryption: p.JoinEncryptionKeyPin,
	}
}

// ServingCA returns the parsed serving CA certificate.
func (p *Public) ServingCA() *x509.Certificate { return p.servingCA }

// NodeCA returns the parsed node CA certificate.
func (p *Public) NodeCA() *x509.Certificate { return p.nodeCA }

// JoinSigningPublicKey returns the key join responses are verified with.
func (p *Public) JoinSigningPublicKey() *ecdsa.PublicKey { return p.joinSigning }

// JoinEncryptionPublicKey returns the key join tokens are sealed to.
func (p *Public) JoinEncryptionPublicKey() *ecdsa.PublicKey { return p.joinEncryption }

// ServingCAPool returns a pool holding only the serving CA.
func (p *Public) ServingCAPool() *x509.CertPool { return poolOf(p.servingCA) }

// NodeCAPool returns a pool holding only the node CA, for verifying node
// client certificates.
func (p *Public) NodeCAPool() *x509.CertPool { return poolOf(p.nodeCA) }

func poolOf(c *x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	if c != nil {
		pool.AddCert(c)
	}
	return pool
}

// Bundle is the whole PKI bundle, private keys included: what the control
// plane runs on.
type Bundle struct {
	// Dir is the directory the bundle was loaded from.
	Dir string
	// Public is the shareable half.
	Public *Public
	// ServingCAKey signs the api and gateway TLS certificates.
	ServingCAKey *ecdsa.PrivateKey
	// JoinSigningKey signs join responses (purpose join-response).
	JoinSigningKey *ecdsa.PrivateKey
	// JoinEncryptionKey opens sealed join tokens.
	JoinEncryptionKey *ecdsa.PrivateKey
	// NodeCAKey signs node certificates.
	NodeCAKey *ecdsa.PrivateKey
}

// testHookWrite, when set, runs before each bundle file is written, so tests
// can make Init fail part way.
var testHookWrite func(name string) error

type bundleFile struct {
	name string
	data []byte
	mode os.FileMode
}

// Init creates a PKI bundle in dir and returns its public half. dir must not
// exist or be empty: a bundle is never overwritten, since replacing the keys
// would orphan every machine that pinned them. Init writes into a fresh
// sibling directory and renames it into place, so dir either holds the whole
// bundle or does not exist. When dir exists (empty), the files are written
// into it with public.json last and removed again on failure. Missing parent
// directories are created, mode 0700.
func Init(dir string, opts InitOptions) (*Public, error) {
	td := opts.TrustDomain
	if td == "" {
		td = DefaultTrustDomain
	}
	if err := ValidateTrustDomain(td); err != nil {
		return nil, fmt.Errorf("pki init: %w", err)
	}
	if dir == "" {
		return nil, errors.New("pki init: no directory")
	}
	dir = filepath.Clean(dir)

	// Refuse before generating anything, so the common mistake is cheap.
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A dangling symlink would be replaced by the rename; refuse it.
		if ok, lerr := exists(dir); lerr != nil || ok {
			return nil, fmt.Errorf("pki init: %s exists (dangling symlink?); refusing to overwrite it: %w", dir, ErrBundleExists)
		}
	case err != nil:
		return nil, fmt.Errorf("pki init: %w", err)
	case !fi.IsDir():
		return nil, fmt.Errorf("pki init: %s exists and is not a directory: %w", dir, ErrBundleExists)
	default:
		// An empty directory others may write in is refused, not chmodded:
		// whatever they can still do with it (a file planted after the
		// emptiness check, an open descriptor) the keys would follow.
		if err := secretfile.CheckDir(dir); err != nil {
			return nil, fmt.Errorf("pki init: %w", err)
		}
		empty, err := isEmptyDir(dir)
		if err != nil {
			return nil, fmt.Errorf("pki init: %w", err)
		}
		if !empty {
			return nil, fmt.Errorf("pki init: %s is not empty; refusing to overwrite an existing PKI bundle: %w", dir, ErrBundleExists)
		}
	}

	pub, files, err := generate(td, time.Now())
	if err != nil {
		return nil, fmt.Errorf("pki init: %w", err)
	}
	// The secrets keyring goes before public.json, which is written last.
	kf, err := newKeyringFile()
	if err != nil {
		return nil, fmt.Errorf("pki init: %w", err)
	}
	files = append(files[:len(files)-1:len(files)-1], kf, files[len(files)-1])
	if fi == nil {
		err = writeNewDir(dir, files)
	} else {
		err = writeIntoEmptyDir(dir, fi.Mode().Perm(), files)
	}
	if err != nil {
		return nil, fmt.Errorf("pki init: %w", err)
	}
	return pub, nil
}

// writeNewDir builds the bundle in a temporary sibling of dir and renames it
// into place, so that no crash or error leaves a partial bundle at dir.
func writeNewDir(dir string, files []bundleFile) (err error) {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, dirMode); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".init-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, dirMode); err != nil {
		return err
	}
	if err := writeFiles(tmp, files); err != nil {
		return err
	}
	// os.Rename refuses to replace a directory, so a dir created meanwhile
	// is not clobbered.
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("move bundle into place: %w", err)
	}
	return SyncDir(parent)
}

// writeIntoEmptyDir fills an existing empty dir (say, a mounted volume that
// cannot be renamed) and on failure removes what it wrote and restores the
// directory's mode.
func writeIntoEmptyDir(dir string, oldMode os.FileMode, files []bundleFile) (err error) {
	if err := os.Chmod(dir, dirMode); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			for _, f := range files {
				os.Remove(filepath.Join(dir, f.name))
			}
			os.Chmod(dir, oldMode)
		}
	}()
	return writeFiles(dir, files)
}

func writeFiles(dir string, files []bundleFile) error {
	for _, f := range files {
		if testHookWrite != nil {
			if err := testHookWrite(f.name); err != nil {
				return err
			}
		}
		if err := WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// generate makes every key and certificate of a bundle in memory and returns
// the files to write, public.json last: its presence marks a complete bundle.
func generate(td string, now time.Time) (*Public, []bundleFile, error) {
	var keys [4]*ecdsa.PrivateKey
	for i := range keys {
		k, err := newKey()
		if err != nil {
			return nil, nil, err
		}
		keys[i] = k
	}
	servingKey, signingKey, encKey, nodeKey := keys[0], keys[1], keys[2], keys[3]

	servingDER, err := newCA(servingKey, "better-compute serving CA ("+td+")", td, false, now)
	if err != nil {
		return nil, nil, err
	}
	nodeDER, err := newCA(nodeKey, "better-compute node CA ("+td+")", td, true, now)
	if err != nil {
		return nil, nil, err
	}
	servingCA, err := x509.ParseCertificate(servingDER)
	if err != nil {
		return nil, nil, err
	}
	nodeCA, err := x509.ParseCertificate(nodeDER)
	if err != nil {
		return nil, nil, err
	}
	jwk, err := PublicJWK(&encKey.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	signingPEM, err := publicKeyPEM(&signingKey.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	signingPin, err := SPKIPin(&signingKey.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	encPin, err := SPKIPin(&encKey.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	pub := &Public{
		Version:              publicVersion,
		TrustDomain:          td,
		ServingCASPKIPin:     CertPin(servingCA),
		JoinSigningKeyPin:    signingPin,
		JoinEncryptionKeyPin: encPin,
		JoinEncryptionJWK:    jwk,
		ServingCAPEM:         string(certPEM(servingDER)),
		NodeCAPEM:            string(certPEM(nodeDER)),
		JoinSigningPublicPEM: string(signingPEM),
		servingCA:            servingCA,
		nodeCA:               nodeCA,
		joinSigning:          &signingKey.PublicKey,
		joinEncryption:       &encKey.PublicKey,
	}
	pubJSON, err := json.MarshalIndent(pub, "", "  ")
	if err != nil {
		return nil, nil, err
	}

	files := []bundleFile{
		{ServingCACertFile, certPEM(servingDER), publicMode},
		{NodeCACertFile, certPEM(nodeDER), publicMode},
		{JoinEncryptionJWKFile, append(jwk, '\n'), publicMode},
	}
	for _, k := range []struct {
		name string
		key  *ecdsa.PrivateKey
	}{
		{ServingCAKeyFile, servingKey},
		{JoinSigningKeyFile, signingKey},
		{JoinEncryptionKeyFile, encKey},
		{NodeCAKeyFile, nodeKey},
	} {
		data, err := MarshalPKCS8PEM(k.key)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, bundleFile{k.name, data, privateMode})
	}
	files = append(files, bundleFile{PublicFile, append(pubJSON, '\n'), publicMode})
	return pub, files, nil
}

// LoadPublic reads dir/public.json and nothing else, so that whatever needs
// only the public half (the install-script generator, the well-known
// document) can run where the private keys are not. Every pin is recomputed
// from the key it names; a file whose parts disagree is refused.
func LoadPublic(dir string) (*Public, error) {
	path := filepath.Join(dir, PublicFile)
	data, err := readFile(path, maxPublicFile, false)
	if err != nil {
		return nil, fmt.Errorf("load PKI bundle: %w", err)
	}
	p, err := parsePublic(data)
	if err != nil {
		return nil, fmt.Errorf("load PKI bundle: %s: %w", path, err)
	}
	return p, nil
}

func parsePublic(data []byte) (*Public, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Public
	if err := dec.Decode(&p); err != nil {
		return nil, err
	}
	if p.Version != publicVersion {
		return nil, fmt.Errorf("version %d, want %d", p.Version, publicVersion)
	}
	if err := ValidateTrustDomain(p.TrustDomain); err != nil {
		return nil, err
	}
	var err error
	if p.servingCA, err = parseCA([]byte(p.ServingCAPEM)); err != nil {
		return nil, fmt.Errorf("serving_ca_pem: %w", err)
	}
	if p.nodeCA, err = parseCA([]byte(p.NodeCAPEM)); err != nil {
		return nil, fmt.Errorf("node_ca_pem: %w", err)
	}
	if p.joinSigning, err = parsePublicKeyPEM([]byte(p.JoinSigningPublicPEM)); err != nil {
		return nil, fmt.Errorf("join_signing_public_pem: %w", err)
	}
	if p.joinEncryption, err = ParsePublicJWK(p.JoinEncryptionJWK); err != nil {
		return nil, fmt.Errorf("join_encryption_jwk: %w", err)
	}
	// Undo public.json's indentation, so the JWK reads the same as the one
	// Init returned and join-encryption.jwk holds.
	var compact bytes.Buffer
	if err := json.Compact(&compact, p.JoinEncryptionJWK); err != nil {
		return nil, fmt.Errorf("join_encryption_jwk: %w", err)
	}
	p.JoinEncryptionJWK = compact.Bytes()
	if got := CertPin(p.servingCA); got != p.ServingCASPKIPin {
		return nil, fmt.Errorf("serving_ca_spki_pin %q is not the pin of serving_ca_pem (%s)", human.ShortN(p.ServingCASPKIPin, 80), got)
	}
	if err := MatchPin(p.JoinSigningKeyPin, p.joinSigning); err != nil {
		return nil, fmt.Errorf("join_signing_key_pin: %w", err)
	}
	if err := MatchPin(p.JoinEncryptionKeyPin, p.joinEncryption); err != nil {
		return nil, fmt.Errorf("join_encryption_key_pin: %w", err)
	}
	return &p, nil
}

func parseCA(data []byte) (*x509.Certificate, error) {
	c, err := parseCertPEM(data)
	if err != nil {
		return nil, err
	}
	if !c.IsCA {
		return nil, errors.New("not a CA certificate")
	}
	if _, err := asP256(c.PublicKey); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadBundle loads the whole bundle in dir: public.json, the four private
// keys and the certificate and JWK files. It refuses a private key file that
// group or others can access, and any file that does not match public.json.
func LoadBundle(dir string) (*Bundle, error) {
	// The private keys' directory: one others may write in could hold keys
	// swapped for theirs.
	if err := secretfile.CheckDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load PKI bundle: %w", err)
	}
	pub, err := LoadPublic(dir)
	if err != nil {
		return nil, err
	}
	b := &Bundle{Dir: dir, Public: pub}
	for _, k := range []struct {
		name string
		dst  **ecdsa.PrivateKey
		want *ecdsa.PublicKey
	}{
		{ServingCAKeyFile, &b.ServingCAKey, pub.servingCA.PublicKey.(*ecdsa.PublicKey)},
		{JoinSigningKeyFile, &b.JoinSigningKey, pub.joinSigning},
		{JoinEncryptionKeyFile, &b.JoinEncryptionKey, pub.joinEncryption},
		{NodeCAKeyFile, &b.NodeCAKey, pub.nodeCA.PublicKey.(*ecdsa.PublicKey)},
	} {
		path := filepath.Join(dir, k.name)
		data, err := readFile(path, maxKeyFile, true)
		if err != nil {
			return nil, fmt.Errorf("load PKI bundle: %w", err)
		}
		key, err := ParsePKCS8PEM(data)
		if err != nil {
			return nil, fmt.Errorf("load PKI bundle: %s: %w", path, err)
		}
		if !key.PublicKey.Equal(k.want) {
			return nil, fmt.Errorf("load PKI bundle: %s does not belong to the public key in %s", path, PublicFile)
		}
		*k.dst = key
	}
	for _, c := range []struct {
		name string
		want *x509.Certificate
	}{
		{ServingCACertFile, pub.servingCA},
		{NodeCACertFile, pub.nodeCA},
	} {
		path := filepath.Join(dir, c.name)
		data, err := readFile(path, maxPublicFile, false)
		if err != nil {
			return nil, fmt.Errorf("load PKI bundle: %w", err)
		}
		cert, err := parseCertPEM(data)
		if err != nil {
			return nil, fmt.Errorf("load PKI bundle: %s: %w", path, err)
		}
		if !cert.Equal(c.want) {
			return nil, fmt.Errorf("load PKI bundle: %s differs from the certificate in %s", path, PublicFile)
		}
	}
	path := filepath.Join(dir, JoinEncryptionJWKFile)
	data, err := readFile(path, MaxJWKSize, false)
	if err != nil {
		return nil, fmt.Errorf("load PKI bundle: %w", err)
	}
	if _, err := JWKMatchesPin(data, pub.JoinEncryptionKeyPin); err != nil {
		return nil, fmt.Errorf("load PKI bundle: %s: %w", path, err)
	}
	return b, nil
}
