package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/better-compute/bcd/internal/human"
)

// DeploySeed is what a deploy writes as the installed OS's cloud-init NoCloud seed
// (NoCloudSeedDir): meta-data with instance-id (the node id),
// local-hostname and public-keys; user-data; network-config when given. A
// zero Seed writes none.
type DeploySeed struct {
	// Hostname is local-hostname: an RFC 1123 host name.
	Hostname string `json:"hostname,omitempty"`
	// SSHAuthorizedKeys are OpenSSH public key lines (authorized_keys
	// format without options), one a line.
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
	// UserData is the user-data file as given; empty means a minimal
	// "#cloud-config".
	UserData string `json:"user_data,omitempty"`
	// NetworkConfig is cloud-init's network-config, written when given.
	NetworkConfig string `json:"network_config,omitempty"`
}

// Bounds of a seed: configuration, not payloads.
const (
	MaxSeedUserData      = 64 << 10
	MaxSeedNetworkConfig = 64 << 10
	MaxSeedKeys          = 64
)

// Empty reports whether the seed asks for nothing.
func (s DeploySeed) Empty() bool {
	return s.Hostname == "" && len(s.SSHAuthorizedKeys) == 0 && s.UserData == "" && s.NetworkConfig == ""
}

// Validate checks the host name, each key and the sizes.
func (s DeploySeed) Validate() error {
	if s.Hostname != "" {
		if err := ValidHostname(s.Hostname); err != nil {
			return fmt.Errorf("seed.hostname (--hostname): %w", err)
		}
	}
	if len(s.SSHAuthorizedKeys) > MaxSeedKeys {
		return fmt.Errorf("seed.ssh_authorized_keys (--ssh-authorized-keys): %d keys, at most %d", len(s.SSHAuthorizedKeys), MaxSeedKeys)
	}
	for i, k := range s.SSHAuthorizedKeys {
		if err := ValidSSHPublicKey(k); err != nil {
			return fmt.Errorf("seed.ssh_authorized_keys (--ssh-authorized-keys) key %d: %w", i+1, err)
		}
	}
	if len(s.UserData) > MaxSeedUserData {
		return fmt.Errorf("seed.user_data (--user-data): %d bytes, at most %d", len(s.UserData), MaxSeedUserData)
	}
	if len(s.NetworkConfig) > MaxSeedNetworkConfig {
		return fmt.Errorf("seed.network_config (--network-config): %d bytes, at most %d", len(s.NetworkConfig), MaxSeedNetworkConfig)
	}
	if !utf8.ValidString(s.UserData) || !utf8.ValidString(s.NetworkConfig) || strings.ContainsRune(s.UserData+s.NetworkConfig, 0) {
		return fmt.Errorf("seed: user-data and network-config must be UTF-8 text")
	}
	return nil
}

// ValidHostname checks an RFC 1123 host name: labels of letters, digits and
// '-', 1 to 63 bytes, not starting or ending with '-', at most 253 in all.
func ValidHostname(h string) error {
	if len(h) == 0 || len(h) > 253 {
		return fmt.Errorf("%q: want an RFC 1123 host name of 1 to 253 characters", human.Short(h))
	}
	for _, l := range strings.Split(h, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: want an RFC 1123 host name (labels of 1 to 63 letters, digits and '-', not starting or ending with '-')", human.Short(h))
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("%q: character %q is not allowed in an RFC 1123 host name", human.Short(h), r)
			}
		}
	}
	return nil
}

// sshKeyTypes are the public key types OpenSSH accepts in authorized_keys.
var sshKeyTypes = map[string]bool{
	"ssh-ed25519": true, "ssh-rsa": true, "ssh-dss": true,
	"ecdsa-sha2-nistp256": true, "ecdsa-sha2-nistp384": true, "ecdsa-sha2-nistp521": true,
	"sk-ssh-ed25519@openssh.com": true, "sk-ecdsa-sha2-nistp256@openssh.com": true,
}

// ValidSSHPublicKey checks one OpenSSH public key line, "TYPE BASE64
// [COMMENT]": a known type, and a base64 blob whose wire format names the
// same type and holds more than it.
func ValidSSHPublicKey(line string) error {
	if strings.ContainsAny(line, "\r\n\x00") || len(line) > 16<<10 {
		return fmt.Errorf("not one line of an OpenSSH public key")
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return fmt.Errorf("%q: want \"TYPE BASE64 [COMMENT]\" (an OpenSSH public key line, as in id_ed25519.pub)", human.Short(line))
	}
	if !sshKeyTypes[f[0]] {
		return fmt.Errorf("%q: not an SSH public key type (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256, …); options before the key are not accepted", human.Short(f[0]))
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil {
		return fmt.Errorf("%s key: the key is not base64", f[0])
	}
	if len(blob) < 4 {
		return fmt.Errorf("%s key: the key is truncated", f[0])
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) || !bytes.Equal(blob[4:4+n], []byte(f[0])) {
		return fmt.Errorf("%s key: the key's data does not name type %s", f[0], f[0])
	}
	if len(blob) == int(4+n) {
		return fmt.Errorf("%s key: the key is truncated", f[0])
	}
	return nil
}

// ParseSSHAuthorizedKeys reads an authorized_keys-style file: one key a
// line, blank lines and # comments skipped, each key checked.
func ParseSSHAuthorizedKeys(b []byte) ([]string, error) {
	var keys []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := ValidSSHPublicKey(line); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		keys = append(keys, line)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no SSH public key in the file")
	}
	return keys, nil
}

// ValidVersion accepts a release version as releases name them: letters,
// digits and . + - _, at most 128 bytes, starting with a letter or digit.
func ValidVersion(v string) bool {
	if v == "" || len(v) > 128 {
		return false
	}
	for i, r := range v {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || i > 0 && strings.ContainsRune(".+-_", r)
		if !ok {
			return false
		}
	}
	return true
}
