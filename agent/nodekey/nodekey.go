// Package nodekey is the node key of a host as every bcd mode uses it: made in
// the host's TPM when it has one (/dev/tpmrm0), so node.key holds only the key's
// record ("BCD TPM NODE KEY"), and a PKCS#8 file otherwise or when the TPM cannot
// hold the key. Loading follows what node.key holds. Host is an agent.KeyStore,
// so the join, the session's mutual TLS and a renewal use the key through one
// crypto.Signer whichever it is; it also gives the tpm attestor its evidence
// (the EK, an AK's certification of the node key) and answers its challenge.
package nodekey

import (
	"crypto"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"

	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// EnvTPMTCP names swtpm's TCP command port for a fakehw build, which the tests
// run against instead of /dev/tpmrm0. A host build ignores it.
const EnvTPMTCP = "BCD_FAKEHW_TPM_TCP"

// ErrNoTPM: the host has no TPM bcd can use.
var ErrNoTPM = errors.New("no TPM")

// Host makes and loads this host's node keys. The zero value uses
// tpm.DefaultPath. It keeps the TPM open once it used it: a TPM key signs
// through it for as long as the process runs.
type Host struct {
	// Path is the TPM device; "" means tpm.DefaultPath.
	Path string
	// RequireTPM makes New fail instead of falling back to a PKCS#8 key (the
	// tpm attestor needs the key in the TPM).
	RequireTPM bool
	// Logger says why a key is not in the TPM; nil discards.
	Logger *slog.Logger
	// Getenv reads EnvTPMTCP on a fakehw build; nil means os.Getenv.
	Getenv func(string) string
	// OpenTPM, when set, opens the TPM instead of Path (tests: swtpm).
	OpenTPM func() (*tpm.TPM, error)

	mu  sync.Mutex
	t   *tpm.TPM
	err error
	ak  *tpm.AK
}

func (h *Host) log() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (h *Host) path() string {
	if h.Path != "" {
		return h.Path
	}
	return tpm.DefaultPath
}

// Where says which TPM the host uses, for messages.
func (h *Host) Where() string {
	if addr := h.tcp(); addr != "" {
		return "swtpm at " + addr
	}
	return h.path()
}

func (h *Host) tcp() string {
	if !buildmode.FakeHW {
		return ""
	}
	get := h.Getenv
	if get == nil {
		get = os.Getenv
	}
	return get(EnvTPMTCP)
}

// TPM opens the host's TPM once; ErrNoTPM (wrapped) when there is none.
func (h *Host) TPM() (*tpm.TPM, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.t != nil || h.err != nil {
		return h.t, h.err
	}
	if h.OpenTPM != nil {
		h.t, h.err = h.OpenTPM()
		return h.t, h.err
	}
	if addr := h.tcp(); addr != "" {
		h.t, h.err = tpm.OpenTCP(addr)
		return h.t, h.err
	}
	if _, err := os.Stat(h.path()); errors.Is(err, fs.ErrNotExist) {
		h.err = fmt.Errorf("%w: %s does not exist", ErrNoTPM, h.path())
		return nil, h.err
	}
	h.t, h.err = tpm.Open(h.path())
	return h.t, h.err
}

// Close closes the TPM if it was opened.
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.t == nil {
		return nil
	}
	err := h.t.Close()
	h.t, h.err = nil, errors.New("nodekey: closed")
	return err
}

// New makes a node key: in the TPM when the host has one, else (unless
// RequireTPM) a PKCS#8 key.
func (h *Host) New() (crypto.Signer, []byte, error) {
	t, err := h.TPM()
	if err == nil {
		key, record, kerr := t.CreateNodeKey()
		if kerr == nil {
			return key, record, nil
		}
		err = kerr
	}
	if h.RequireTPM {
		return nil, nil, fmt.Errorf("the node key must be made in the TPM (%s): %w", h.Where(), err)
	}
	if !errors.Is(err, ErrNoTPM) {
		h.log().Warn("the TPM cannot hold the node key; node.key is a PKCS#8 file instead", "tpm", h.Where(), "err", err)
	}
	key, err := pki.NewP256Key()
	if err != nil {
		return nil, nil, err
	}
	file, err := pki.MarshalPKCS8PEM(key)
	if err != nil {
		return nil, nil, err
	}
	return key, file, nil
}

// Load reads node.key's content: a TPM record is loaded into the TPM, anything
// else is PKCS#8.
func (h *Host) Load(nodeKeyFile []byte) (crypto.Signer, error) {
	if !tpm.IsRecord(nodeKeyFile) {
		return pki.ParsePKCS8PEM(nodeKeyFile)
	}
	t, err := h.TPM()
	if err != nil {
		return nil, fmt.Errorf("node.key is a TPM key's record, but the TPM does not open: %w", err)
	}
	return t.LoadNodeKey(nodeKeyFile)
}

// EKClaim is the EK's public key as the join's claims carry it (PEM), ""
// when the host has no TPM.
func (h *Host) EKClaim() (string, error) {
	t, err := h.TPM()
	if errors.Is(err, ErrNoTPM) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	ek, err := t.EK()
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ek.PKIX})), nil
}

// Evidence is the tpm attestor's round one for key, a node key this Host made
// in the TPM: the EK (and its certificate), a new AK, and the AK's
// certification of key with csrSHA256 (the raw digest of the CSR's DER) as
// qualifying data. The AK is kept for Activate.
func (h *Host) Evidence(key crypto.Signer, csrSHA256 []byte) (*protocol.TPMAttestation, error) {
	k, ok := key.(*tpm.Key)
	if !ok {
		return nil, errors.New("tpm: the node key is not in the TPM")
	}
	t, err := h.TPM()
	if err != nil {
		return nil, err
	}
	ek, err := t.EK()
	if err != nil {
		return nil, err
	}
	ak, err := t.CreateAK()
	if err != nil {
		return nil, err
	}
	attest, sig, err := t.Certify(k, ak, csrSHA256)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.ak = ak
	h.mu.Unlock()
	b64 := base64.StdEncoding.EncodeToString
	a := &protocol.TPMAttestation{EKPublic: b64(ek.PKIX), AKPublic: b64(ak.TPMTPublic()), CertifyInfo: b64(attest), CertifySignature: b64(sig)}
	if len(ek.Certificate) > 0 {
		a.EKCert = b64(ek.Certificate)
	}
	return a, nil
}

// Activate recovers a TPMChallenge's secret with the AK of the last Evidence.
func (h *Host) Activate(ch *protocol.TPMChallenge) ([]byte, error) {
	h.mu.Lock()
	ak := h.ak
	h.mu.Unlock()
	if ak == nil {
		return nil, errors.New("tpm: a challenge came before any evidence")
	}
	blob, err := base64.StdEncoding.DecodeString(ch.CredentialBlob)
	if err != nil {
		return nil, fmt.Errorf("tpm challenge: credential_blob: %w", err)
	}
	secret, err := base64.StdEncoding.DecodeString(ch.EncryptedSecret)
	if err != nil {
		return nil, fmt.Errorf("tpm challenge: encrypted_secret: %w", err)
	}
	t, err := h.TPM()
	if err != nil {
		return nil, err
	}
	return t.ActivateCredential(ak, blob, secret)
}
