package machines

import (
	"errors"
	"fmt"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Paths of the files a deploy writes into the installed root filesystem:
// what the installed OS's `bcd join --token-file /etc/bcd/join-token
// --node-id $(cat /etc/bcd/node-id)` reads.
const (
	InstallConfigPath = config.DefaultPath // /etc/bcd/config.toml
	InstallJWKPath    = "/etc/bcd/join-encryption.jwk"
	InstallTokenPath  = "/etc/bcd/join-token"
	InstallNodeIDPath = "/etc/bcd/node-id"
)

// Install is what the installed OS needs to join as a node.
type Install struct {
	// GatewayURL and GatewayServerName are the gateway's, as the
	// well-known document publishes them.
	GatewayURL        string
	GatewayServerName string
	// Site is the machine's site.
	Site string
	// Pins are the PKI bundle's three pins.
	Pins pki.Pins
	// EncryptionJWK is the join encryption public key (join-encryption.jwk).
	EncryptionJWK []byte
	// Token is the provisioned join token, bound to NodeID. A secret.
	Token  string
	NodeID string
}

// InstallFiles are the four files a deploy writes into the installed root:
// config.toml (rendered by config.Format, so byte for byte what bcd reads),
// join-encryption.jwk, join-token and node-id, each 0600 and root's. The
// configuration is parsed back before it is handed out, so a value bcd would
// refuse fails the deploy here rather than the installed OS's first boot.
func InstallFiles(in Install) ([]protocol.DeployFile, error) {
	if in.Token == "" || !protocol.ValidNodeID(in.NodeID) {
		return nil, errors.New("install files: a token and a valid node id are required")
	}
	if err := in.Pins.Validate(); err != nil {
		return nil, fmt.Errorf("install files: %w", err)
	}
	if _, err := pki.JWKMatchesPin(in.EncryptionJWK, in.Pins.JoinEncryption); err != nil {
		return nil, fmt.Errorf("install files: join-encryption.jwk: %w", err)
	}
	c := &config.Config{
		GatewayURL:           in.GatewayURL,
		GatewayServerName:    in.GatewayServerName,
		Site:                 in.Site,
		ServingCASPKIPin:     in.Pins.ServingCA,
		JoinSigningKeyPin:    in.Pins.JoinSigning,
		JoinEncryptionKeyPin: in.Pins.JoinEncryption,
	}
	cfg := config.Format(c)
	if _, err := config.Parse(cfg, config.ParseOptions{}); err != nil {
		return nil, fmt.Errorf("install files: the installed OS's config.toml would not load: %w", err)
	}
	file := func(path string, content []byte) protocol.DeployFile {
		return protocol.DeployFile{FS: protocol.FSRoot, Path: path, Mode: 0o600, UID: 0, GID: 0, Content: content}
	}
	jwk := append([]byte(nil), in.EncryptionJWK...)
	if len(jwk) > 0 && jwk[len(jwk)-1] != '\n' {
		jwk = append(jwk, '\n')
	}
	return []protocol.DeployFile{
		file(InstallConfigPath, cfg),
		file(InstallJWKPath, jwk),
		file(InstallTokenPath, []byte(in.Token+"\n")),
		file(InstallNodeIDPath, []byte(in.NodeID+"\n")),
	}, nil
}
