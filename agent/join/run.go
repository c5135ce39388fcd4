package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// JWKFile is the join encryption key's file beside config.toml.
const JWKFile = "join-encryption.jwk"

// ResetHint ends every message that sends an operator to --reset.
const ResetHint = "bcd join --reset --yes, then bcd join"

// Options are bcd join's flags and surroundings. Zero values are the command's
// defaults; tests replace the surroundings (Env, Stdin, IsRoot, …).
type Options struct {
	// ConfigPath is --config (default config.DefaultPath).
	ConfigPath string
	// DataDir is --data-dir; it overrides config.toml's data_dir.
	DataDir string
	// Role is --role: node (default) or site.
	Role string
	// Attestor is --attestor; empty picks provisioned with NodeID, else join-token.
	Attestor string
	// NodeID is --node-id, the node an installed OS was provisioned as.
	NodeID string
	// TokenFile is --token-file.
	TokenFile string
	// Server is --server, the control plane's URL for the well-known document.
	Server string
	// Pins are --serving-ca-pin, --join-signing-pin and --join-encryption-pin.
	Pins pki.Pins
	// Reset and Yes are --reset and --yes.
	Reset, Yes bool

	// FakeHW is a development build: http:// and no pins are accepted.
	FakeHW bool
	// Getenv reads BCD_JOIN_TOKEN; nil means os.Getenv.
	Getenv func(string) string
	// Stdin may carry the token; Stdout gets what the operator reads.
	Stdin  io.Reader
	Stdout io.Writer
	// Logger gets warnings and retries; nil discards them.
	Logger *slog.Logger
	// IsRoot tells whether bcd runs as root; nil checks the effective uid.
	IsRoot func() bool
	// Claims gathers the hardware claims; nil uses agent.ClaimsSource{}.
	Claims func(context.Context) protocol.Claims
	// WellKnownRoots verify the control plane's TLS; nil means the system roots.
	WellKnownRoots *x509.CertPool
	// Backoff, GiveUpAfter and MaxDeferral tune the client (see Client).
	Backoff     agent.Backoff
	GiveUpAfter time.Duration
	MaxDeferral time.Duration
	// Now is the clock of moved-aside names; nil means time.Now.
	Now func() time.Time
	// Keys makes and loads the node key; nil is agent.PKCS8Keys.
	Keys agent.KeyStore
	// TPM is the host's TPM (nodekey.Host), nil for none: the tpm
	// attestor's evidence and the EK claim. With --attestor tpm, Keys must
	// make the node key in it.
	TPM HostTPM
}

func (o *Options) defaults() {
	if o.ConfigPath == "" {
		o.ConfigPath = config.DefaultPath
	}
	if o.Role == "" {
		o.Role = protocol.RoleNode
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.IsRoot == nil {
		o.IsRoot = func() bool { return os.Geteuid() == 0 }
	}
	if o.Claims == nil {
		o.Claims = agent.ClaimsSource{}.Collect
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// check refuses flag combinations that cannot mean anything, before anything is
// read or moved. Each is a usage error: exit 2.
func (o *Options) check() error {
	switch o.Role {
	case protocol.RoleNode, protocol.RoleSite:
	case protocol.RoleRamdisk:
		return cli.Usagef("bcd join: --role ramdisk joins from the kernel command line (bcd ramdisk), not with bcd join")
	default:
		return cli.Usagef("bcd join: --role %q: want node or site", o.Role)
	}
	if o.NodeID != "" && !protocol.ValidNodeID(o.NodeID) {
		return cli.Usagef("bcd join: --node-id %q: want 1 to 64 characters of a-z, 0-9, _ and -", o.NodeID)
	}
	switch o.Attestor {
	case "":
		o.Attestor = protocol.AttestorJoinToken
		if o.NodeID != "" {
			o.Attestor = protocol.AttestorProvisioned
		}
	case protocol.AttestorJoinToken:
		if o.NodeID != "" {
			return cli.Usagef("bcd join: --node-id goes with --attestor provisioned")
		}
	case protocol.AttestorProvisioned:
		if o.NodeID == "" {
			return cli.Usagef("bcd join: --attestor provisioned needs --node-id")
		}
	case protocol.AttestorTPM:
		switch {
		case o.NodeID != "":
			return cli.Usagef("bcd join: --node-id goes with --attestor provisioned, not tpm")
		case o.TokenFile != "":
			return cli.Usagef("bcd join: --attestor tpm takes no token (--token-file)")
		case o.Role != protocol.RoleNode:
			return cli.Usagef("bcd join: --attestor tpm joins role node, not %s", o.Role)
		}
	default:
		return cli.Usagef("bcd join: --attestor %q: want join-token, provisioned or tpm", o.Attestor)
	}
	if o.Yes && !o.Reset {
		return cli.Usagef("bcd join: --yes only confirms --reset")
	}
	for _, p := range []struct{ flag, v string }{
		{"--serving-ca-pin", o.Pins.ServingCA},
		{"--join-signing-pin", o.Pins.JoinSigning},
		{"--join-encryption-pin", o.Pins.JoinEncryption},
	} {
		if p.v == "" {
			continue
		}
		if _, err := pki.ParsePin(p.v); err != nil {
			return cli.Usagef("bcd join: %s: %v", p.flag, err)
		}
	}
	if o.Server != "" {
		u, err := url.Parse(o.Server)
		if err != nil || u.Host == "" || (u.Scheme != "https" && !(o.FakeHW && u.Scheme == "http")) {
			return cli.Usagef("bcd join: --server %q: want an https:// URL of the control plane", o.Server)
		}
	}
	if o.TokenFile != "" && o.Getenv(EnvToken) != "" {
		return cli.Usagef("bcd join: both %s and --token-file are set; give the token one way", EnvToken)
	}
	return nil
}

// setup is where the join goes and what it trusts, from config.toml or from the
// well-known document.
type setup struct {
	cfg        *config.Config // nil when bootstrapping
	gatewayURL string
	serverName string
	pins       pki.Pins
	encKey     *ecdsa.PublicKey
	jwk        []byte // written beside the new config.toml when bootstrapping
	serverDoc  string // the well-known URL, when bootstrapping
}

// Run is bcd join. Its errors carry their exit code (internal/cli): 2 for usage, 1
// for a refusal or failure; "already joined" is success.
func Run(ctx context.Context, o Options) error {
	o.defaults()
	if err := o.check(); err != nil {
		return err
	}
	cfg, err := loadConfig(o)
	if err != nil {
		return err
	}
	dataDir := o.DataDir
	if dataDir == "" && cfg != nil {
		dataDir = cfg.DataDir
	}
	if dataDir == "" {
		dataDir = config.DefaultDataDir
	}
	journalPath := filepath.Join(dataDir, journal.FileName)
	if cfg != nil && cfg.Journal != nil && cfg.Journal.Path != "" {
		journalPath = cfg.Journal.Path
	}

	if o.Reset {
		if err := reset(o, dataDir, journalPath); err != nil {
			return err
		}
	}

	id, err := agent.LoadIdentity(dataDir, o.Keys)
	switch {
	case err == nil:
		fmt.Fprintf(o.Stdout, "already joined as %s\n", id.NodeID)
		if id.Role != o.Role {
			o.Logger.Warn("this machine joined with another role than --role asks", "role", id.Role, "wanted", o.Role)
		}
		if err := handOver(cfg, dataDir, o.IsRoot()); err != nil {
			return cli.Exit(1, err)
		}
		return removeTokenFile(o)
	case !errors.Is(err, agent.ErrNotJoined):
		return cli.Exit(1, fmt.Errorf("bcd join: the identity in %s does not load (%v); to join again: %s", dataDir, err, ResetHint))
	}

	claims := o.Claims(ctx)
	var token string
	var prover TPMProver
	var reclaim *ReclaimKey
	if o.Attestor == protocol.AttestorTPM {
		// No token: the TPM proves the machine. The node key must be made in
		// the same TPM the evidence comes from.
		if o.TPM == nil {
			return cli.Exit(1, errors.New("bcd join: --attestor tpm: this bcd has no TPM access"))
		}
		ek, err := o.TPM.EKClaim()
		switch {
		case err != nil:
			return cli.Exit(1, fmt.Errorf("bcd join: --attestor tpm: reading the endorsement key: %w", err))
		case ek == "":
			return cli.Exit(1, fmt.Errorf("bcd join: --attestor tpm needs a TPM, and this host has none (%s)", o.TPM.Where()))
		}
		claims.TPMEK, prover = ek, o.TPM
	} else {
		t, from, err := TokenSource{File: o.TokenFile, Env: o.Getenv(EnvToken), Stdin: o.Stdin}.Read()
		if errors.Is(err, ErrNoToken) {
			return cli.Usagef("bcd join: %v", err)
		}
		if err != nil {
			return cli.Exit(1, fmt.Errorf("bcd join: %w", err))
		}
		o.Logger.Debug("read the join token", "from", from)
		token = t
		if o.Attestor == protocol.AttestorJoinToken {
			// A token join of this machine's hardware reclaims the node it
			// was only with proof: the key of the identity --reset moved aside.
			if old := MovedIdentity(dataDir, o.Keys, o.Logger); old != nil {
				reclaim = &ReclaimKey{NodeID: old.NodeID, Key: old.Key()}
				o.Logger.Info("joining with the proof of the key of the node this machine was (moved aside by bcd join --reset); the control plane gives that node back to a join of the same hardware",
					"node", old.NodeID)
			}
		}
		if o.TPM != nil {
			// The EK, where there is one, lets a later join of this hardware
			// reclaim its node.
			if ek, err := o.TPM.EKClaim(); err == nil {
				claims.TPMEK = ek
			} else {
				o.Logger.Warn("the TPM's endorsement key does not read; joining without it", "err", err)
			}
		}
	}

	s, err := resolve(ctx, o, cfg)
	if err != nil {
		return err
	}
	site := ""
	if cfg != nil {
		site = cfg.Site
	}
	client := &Client{
		GatewayURL:    s.gatewayURL,
		ServerName:    s.serverName,
		Pins:          s.pins,
		EncryptionKey: s.encKey,
		Backoff:       o.Backoff,
		GiveUpAfter:   o.GiveUpAfter,
		MaxDeferral:   o.MaxDeferral,
		Logger:        o.Logger,
		Keys:          o.Keys,
	}
	client.TPM = prover
	id, key, err := client.Join(ctx, Request{
		Role:     o.Role,
		Attestor: o.Attestor,
		Token:    token,
		NodeID:   o.NodeID,
		Site:     site,
		Claims:   claims,
		Reclaim:  reclaim,
	})
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	if err := agent.SaveIdentity(dataDir, id, key); err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join: joined as %s but could not store the identity: %w", id.NodeID, err))
	}
	if m, err := moveForeignJournal(journalPath, id.NodeID, o.Now(), o.Logger); err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join: joined as %s: %w", id.NodeID, err))
	} else if m != nil {
		fmt.Fprintf(o.Stdout, "moved the journal of an earlier identity aside: %s -> %s\n", m.From, m.To)
	}
	if s.cfg == nil {
		if err := writeBootstrapConfig(o, s, id, dataDir); err != nil {
			return cli.Exit(1, fmt.Errorf("bcd join: joined as %s: %w", id.NodeID, err))
		}
	}
	if err := handOver(cfg, dataDir, o.IsRoot()); err != nil {
		return cli.Exit(1, err)
	}
	fmt.Fprintf(o.Stdout, "joined as %s (role %s, site %s)\n", id.NodeID, id.Role, orNone(id.Site))
	return removeTokenFile(o)
}

// HostTPM is the host's TPM as bcd join uses it (nodekey.Host).
type HostTPM interface {
	TPMProver
	// EKClaim is the EK's PEM public key, "" when the host has no TPM.
	EKClaim() (string, error)
	// Where names the TPM in messages.
	Where() string
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// loadConfig reads config.toml, or returns nil when there is none and the join
// bootstraps from --server. It also checks the pin flags against the file.
func loadConfig(o Options) (*config.Config, error) {
	_, statErr := os.Stat(o.ConfigPath)
	if errors.Is(statErr, fs.ErrNotExist) {
		if o.Server == "" {
			return nil, cli.Exit(1, fmt.Errorf("bcd join: %s does not exist: install it (the install script writes it), or join from the control plane with --server and the three pins", o.ConfigPath))
		}
		if !o.FakeHW && (o.Pins.ServingCA == "" || o.Pins.JoinSigning == "" || o.Pins.JoinEncryption == "") {
			return nil, cli.Usagef("bcd join: joining without config.toml needs --serving-ca-pin, --join-signing-pin and --join-encryption-pin from the install")
		}
		return nil, nil
	}
	cfg, err := config.Load(o.ConfigPath, config.ParseOptions{AllowHTTP: o.FakeHW})
	if err != nil {
		if config.IsInvalid(err) {
			return nil, cli.Usagef("bcd join: %w", err)
		}
		return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	for _, k := range []struct{ key, v string }{
		{"gateway_url", cfg.GatewayURL},
		{"serving_ca_spki_pin", cfg.ServingCASPKIPin},
		{"join_signing_key_pin", cfg.JoinSigningKeyPin},
		{"join_encryption_key_pin", cfg.JoinEncryptionKeyPin},
	} {
		if k.v == "" {
			return nil, cli.Usagef("bcd join: %s has no %s", o.ConfigPath, k.key)
		}
	}
	for _, p := range []struct{ flag, given, key, have string }{
		{"--serving-ca-pin", o.Pins.ServingCA, "serving_ca_spki_pin", cfg.ServingCASPKIPin},
		{"--join-signing-pin", o.Pins.JoinSigning, "join_signing_key_pin", cfg.JoinSigningKeyPin},
		{"--join-encryption-pin", o.Pins.JoinEncryption, "join_encryption_key_pin", cfg.JoinEncryptionKeyPin},
	} {
		if p.given != "" && p.given != p.have {
			return nil, cli.Exit(1, fmt.Errorf("refusing to join: %s %s is not %s in %s (%s); the configuration wins", p.flag, p.given, p.key, o.ConfigPath, p.have))
		}
	}
	return cfg, nil
}

// resolve decides the gateway and the keys, from config.toml or the document.
func resolve(ctx context.Context, o Options, cfg *config.Config) (*setup, error) {
	if cfg != nil {
		s := &setup{
			cfg:        cfg,
			gatewayURL: cfg.GatewayURL,
			pins:       pki.Pins{ServingCA: cfg.ServingCASPKIPin, JoinSigning: cfg.JoinSigningKeyPin, JoinEncryption: cfg.JoinEncryptionKeyPin},
		}
		var err error
		if s.serverName, err = agent.ServerName(cfg.GatewayURL, cfg.GatewayServerName); err != nil {
			return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
		}
		jwkPath := filepath.Join(filepath.Dir(o.ConfigPath), JWKFile)
		// At most what the well-known document may be; anything but a regular
		// file (a FIFO would hang the join) is refused naming what it is.
		data, err := secretfile.Read(jwkPath, secretfile.Options{Limit: protocol.MaxWellKnownSize})
		switch {
		case err == nil:
			if s.encKey, err = pki.JWKMatchesPin(data, s.pins.JoinEncryption); err != nil {
				return nil, cli.Exit(1, fmt.Errorf("refusing to join: %s: %w (it must be the key join_encryption_key_pin names)", jwkPath, err))
			}
			return s, nil
		case !errors.Is(err, fs.ErrNotExist):
			return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
		case o.Server == "":
			return nil, cli.Exit(1, fmt.Errorf("bcd join: %s does not exist: install it beside %s, or give --server to fetch the key from the control plane", jwkPath, o.ConfigPath))
		}
		doc, err := FetchWellKnown(ctx, o.Server, o.WellKnownRoots)
		if err != nil {
			return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
		}
		if s.encKey, err = pki.JWKMatchesPin(doc.Join.EncryptionJWK, s.pins.JoinEncryption); err != nil {
			return nil, cli.Exit(1, fmt.Errorf("refusing to join: the join.encryptionJwk of %s: %w", o.Server, err))
		}
		return s, nil
	}
	wk := o.Server + protocol.PathWellKnown
	doc, err := FetchWellKnown(ctx, o.Server, o.WellKnownRoots)
	if err != nil {
		if errors.Is(err, errRedirect) {
			return nil, cli.Exit(1, fmt.Errorf("refusing to join: %w", err))
		}
		return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	b, err := CheckWellKnown(doc, o.Pins, wk, o.FakeHW, o.FakeHW)
	if err != nil {
		return nil, cli.Exit(1, err)
	}
	s := &setup{gatewayURL: b.GatewayURL, pins: b.Pins, encKey: b.EncryptionKey, jwk: b.JWK, serverDoc: wk}
	if s.serverName, err = agent.ServerName(b.GatewayURL, b.ServerName); err != nil {
		return nil, cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	// Check now that the configuration the join will write parses, so that a
	// document bcd cannot turn into a config.toml fails before the token is spent.
	if _, err := config.Parse(config.Format(bootstrapConfig(o, s, "pending", "")), config.ParseOptions{AllowHTTP: o.FakeHW}); err != nil {
		return nil, cli.Exit(1, fmt.Errorf("refusing to join: %s cannot become a config.toml: %w", wk, err))
	}
	return s, nil
}

func bootstrapConfig(o Options, s *setup, site, dataDir string) *config.Config {
	c := &config.Config{
		GatewayURL:           s.gatewayURL,
		Site:                 site,
		ServingCASPKIPin:     s.pins.ServingCA,
		JoinSigningKeyPin:    s.pins.JoinSigning,
		JoinEncryptionKeyPin: s.pins.JoinEncryption,
	}
	if u, err := url.Parse(s.gatewayURL); err == nil && s.serverName != u.Hostname() {
		c.GatewayServerName = s.serverName
	}
	if dataDir != config.DefaultDataDir {
		c.DataDir = dataDir
	}
	return c
}

// writeBootstrapConfig writes config.toml (0600, with the site the join answered)
// and join-encryption.jwk (0644) beside it, after the join succeeded.
func writeBootstrapConfig(o Options, s *setup, id *agent.Identity, dataDir string) error {
	dir := filepath.Dir(o.ConfigPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data := config.Format(bootstrapConfig(o, s, id.Site, dataDir))
	if err := pki.WriteFileAtomic(o.ConfigPath, data, 0o600); err != nil {
		return err
	}
	jwk := append([]byte(nil), s.jwk...)
	if len(jwk) > 0 && jwk[len(jwk)-1] != '\n' {
		jwk = append(jwk, '\n')
	}
	jwkPath := filepath.Join(dir, JWKFile)
	if err := pki.WriteFileAtomic(jwkPath, jwk, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(o.Stdout, "wrote %s and %s from %s\n", o.ConfigPath, jwkPath, s.serverDoc)
	return nil
}

// reset moves the identity and journal aside (--reset --yes) or says what it would
// move (--reset alone, exit 2).
func reset(o Options, dataDir, journalPath string) error {
	if !o.FakeHW && !o.IsRoot() {
		return cli.Exit(1, errors.New("bcd join --reset: run it as root"))
	}
	moves, err := ResetPlan(dataDir, journalPath, o.Now())
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	if !o.Yes {
		if len(moves) == 0 {
			fmt.Fprintf(o.Stdout, "bcd join --reset: nothing to move in %s\n", dataDir)
		} else {
			fmt.Fprintln(o.Stdout, "bcd join --reset would move (nothing is deleted):")
			for _, m := range moves {
				fmt.Fprintf(o.Stdout, "  %s -> %s\n", m.From, m.To)
			}
		}
		fmt.Fprintln(o.Stdout, "run it again with --yes to move them and join")
		return cli.ExitSilently(2)
	}
	done, err := ApplyMoves(moves)
	for _, m := range done {
		fmt.Fprintf(o.Stdout, "moved %s -> %s\n", m.From, m.To)
	}
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join --reset: %w", err))
	}
	return nil
}

// handOver gives node.key and identity.json to the [helper] user, so that an
// unprivileged bcd node can read its key after a join that ran as root. Lchown,
// so a name swapped for a symlink changes only the link.
func handOver(cfg *config.Config, dataDir string, root bool) error {
	if cfg == nil || cfg.Helper == nil || !root {
		return nil
	}
	name := cfg.Helper.User
	if name == "" {
		name = config.DefaultHelperUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("bcd join: hand the identity to the [helper] user %s: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("bcd join: [helper] user %s has uid %q gid %q", name, u.Uid, u.Gid)
	}
	for _, f := range []string{agent.KeyFile, agent.IdentityFile} {
		if err := os.Lchown(filepath.Join(dataDir, f), uid, gid); err != nil {
			return fmt.Errorf("bcd join: hand the identity to the [helper] user %s: %w", name, err)
		}
	}
	return nil
}

func removeTokenFile(o Options) error {
	if o.TokenFile == "" {
		return nil
	}
	readOnly, err := RemoveTokenFile(o.TokenFile)
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd join: %w", err))
	}
	if readOnly {
		o.Logger.Warn("the used token file is on a read-only mount and stays; delete it at its source (a token is single use)",
			"token_file", o.TokenFile)
	}
	return nil
}
