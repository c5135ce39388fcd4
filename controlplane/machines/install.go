package machines

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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

// SeedFiles are the cloud-init NoCloud seed a deploy writes
// (protocol.NoCloudSeedDir), none for a zero seed: meta-data (instance-id,
// the node id; local-hostname; public-keys), user-data (the operator's,
// else "#cloud-config"), network-config when given. 0600 and root's:
// user-data may hold secrets, and cloud-init runs as root.
func SeedFiles(s protocol.DeploySeed, nodeID string) ([]protocol.DeployFile, error) {
	if s.Empty() {
		return nil, nil
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var md strings.Builder
	// JSON strings are YAML scalars, so no value can break the document.
	q := func(v string) string { b, _ := json.Marshal(v); return string(b) }
	fmt.Fprintf(&md, "instance-id: %s\n", q(nodeID))
	if s.Hostname != "" {
		fmt.Fprintf(&md, "local-hostname: %s\n", q(s.Hostname))
	}
	if len(s.SSHAuthorizedKeys) > 0 {
		md.WriteString("public-keys:\n")
		for _, k := range s.SSHAuthorizedKeys {
			fmt.Fprintf(&md, "  - %s\n", q(k))
		}
	}
	ud := s.UserData
	if ud == "" {
		ud = "#cloud-config\n"
	}
	file := func(name, content string) protocol.DeployFile {
		return protocol.DeployFile{FS: protocol.FSRoot, Path: protocol.NoCloudSeedDir + "/" + name, Mode: 0o600, Content: []byte(content)}
	}
	out := []protocol.DeployFile{file("meta-data", md.String()), file("user-data", ud)}
	if s.NetworkConfig != "" {
		out = append(out, file("network-config", s.NetworkConfig))
	}
	return out, nil
}
