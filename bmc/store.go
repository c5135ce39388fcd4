package bmc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// HostsFile is the file under data_dir where a site agent keeps its BMC hosts.
const HostsFile = "bmc-hosts.json"

// MaxHostsSize bounds bmc-hosts.json and a bmc_hosts section.
const MaxHostsSize = 4 << 20

// HostsKeyFile is the keyring under data_dir that seals the passwords in
// bmc-hosts.json: a copy of the file alone (a backup) yields none.
const HostsKeyFile = "bmc-hosts.key"

// hostsFileVersion is the format of bmc-hosts.json: 2 has every password
// sealed under HostsKeyFile; 1 (before sealing) had them in the clear, and is
// read once and rewritten as 2.
const (
	hostsFileVersion   = 2
	plainHostsVersion  = 1
	hostsPasswordLabel = "bmc-hosts password"
)

type hostsFile struct {
	Version int                `json:"version"`
	Hosts   []protocol.BMCHost `json:"hosts"`
}

// Store keeps the site's BMC hosts from its desired state in bmc-hosts.json (0600,
// replaced atomically, each password sealed under bmc-hosts.key), so a restarted
// site agent can drive BMCs before the control plane answers. It is safe for
// concurrent use.
type Store struct {
	path  string
	key   *pki.Keyring
	mu    sync.RWMutex
	hosts map[string]protocol.BMCHost
}

// OpenStore reads <dataDir>/bmc-hosts.json, or starts empty when there is none,
// with the keyring <dataDir>/bmc-hosts.key (0600, created when missing). A file
// that group or others may access is refused: it holds BMC passwords, and one
// that has been readable must be treated as leaked. A file from before sealing
// is rewritten sealed.
func OpenStore(dataDir string) (*Store, error) {
	s := &Store{path: filepath.Join(dataDir, HostsFile), hosts: map[string]protocol.BMCHost{}}
	b, err := secretfile.Read(s.path, secretfile.Options{Limit: MaxHostsSize, Private: true, What: "BMC passwords (treat them as leaked)", NoFollow: true})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("bmc hosts: %w", err)
	}
	k, kerr := pki.OpenKeyring(filepath.Join(dataDir, HostsKeyFile), true)
	if kerr != nil {
		return nil, fmt.Errorf("bmc hosts: %w", kerr)
	}
	s.key = k
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	var hf hostsFile
	if err := json.Unmarshal(b, &hf); err != nil {
		return nil, fmt.Errorf("bmc hosts: %s: %w", s.path, JSONError(err))
	}
	switch hf.Version {
	case hostsFileVersion:
		for i, h := range hf.Hosts {
			if h.Password == "" {
				continue
			}
			if hf.Hosts[i].Password, err = k.Open(hostsPasswordLabel, h.Password); err != nil {
				return nil, fmt.Errorf("bmc hosts: %s: machine %s: %w", s.path, h.Machine, err)
			}
		}
	case plainHostsVersion:
	default:
		return nil, fmt.Errorf("bmc hosts: %s has version %d, this bcd reads versions %d and %d", s.path, hf.Version, plainHostsVersion, hostsFileVersion)
	}
	sec := protocol.BMCHostsSection{Hosts: hf.Hosts}
	if err := sec.Validate(); err != nil {
		return nil, fmt.Errorf("bmc hosts: %s: %w", s.path, err)
	}
	for _, h := range hf.Hosts {
		s.hosts[h.Machine] = h
	}
	if hf.Version == plainHostsVersion {
		if err := s.write(s.hosts); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ParseHostsSection decodes and checks a bmc_hosts section from the control plane.
// Its errors name the machine at fault and never quote a password.
func ParseHostsSection(raw []byte) (protocol.BMCHostsSection, error) {
	var sec protocol.BMCHostsSection
	if len(raw) > MaxHostsSize {
		return sec, fmt.Errorf("bmc_hosts: section is larger than %d bytes", MaxHostsSize)
	}
	if err := json.Unmarshal(raw, &sec); err != nil {
		return protocol.BMCHostsSection{}, fmt.Errorf("bmc_hosts: %w", JSONError(err))
	}
	if err := sec.Validate(); err != nil {
		return protocol.BMCHostsSection{}, fmt.Errorf("bmc_hosts: %w", err)
	}
	return sec, nil
}

// JSONError describes a decoding error without quoting the input: a syntax
// error's message can carry a character of a password. The site agent's decoding
// of bmc.* params uses it too, so every BMC-related decode error reads the same.
func JSONError(err error) error {
	var se *json.SyntaxError
	var ute *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("not valid JSON (at byte %d)", se.Offset)
	case errors.As(err, &ute):
		return fmt.Errorf("%s must be %s, not a JSON %s", ute.Field, ute.Type, ute.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("not valid JSON (truncated)")
	}
	return errors.New("not valid JSON")
}

// Apply makes sec the store's hosts, replacing every earlier entry, and writes the
// file when anything changed.
func (s *Store) Apply(sec protocol.BMCHostsSection) error {
	if err := sec.Validate(); err != nil {
		return fmt.Errorf("bmc_hosts: %w", err)
	}
	next := make(map[string]protocol.BMCHost, len(sec.Hosts))
	for _, h := range sec.Hosts {
		next[h.Machine] = h
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if maps.Equal(s.hosts, next) {
		if _, err := os.Stat(s.path); err == nil || len(next) == 0 {
			return nil
		}
	}
	if err := s.write(next); err != nil {
		return err
	}
	s.hosts = next
	return nil
}

// write replaces the file with hosts, their passwords sealed.
func (s *Store) write(hosts map[string]protocol.BMCHost) error {
	b, err := s.encodeHosts(hosts)
	if err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(s.path, b, 0o600); err != nil {
		return fmt.Errorf("bmc hosts: %w", err)
	}
	return nil
}

func (s *Store) encodeHosts(m map[string]protocol.BMCHost) ([]byte, error) {
	hf := hostsFile{Version: hostsFileVersion, Hosts: make([]protocol.BMCHost, 0, len(m))}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		h := m[name]
		if h.Password != "" {
			var err error
			if h.Password, err = s.key.Seal(hostsPasswordLabel, h.Password); err != nil {
				return nil, fmt.Errorf("bmc hosts: seal: %w", err)
			}
		}
		hf.Hosts = append(hf.Hosts, h)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(hf); err != nil {
		return nil, fmt.Errorf("bmc hosts: encode: %w", err)
	}
	return buf.Bytes(), nil
}

// Lookup returns the BMC of machine and the driver its entry names.
func (s *Store) Lookup(machine string) (Host, string, bool) {
	s.mu.RLock()
	e, ok := s.hosts[machine]
	s.mu.RUnlock()
	if !ok {
		return Host{}, "", false
	}
	driver := e.Driver
	if driver == "" {
		driver = protocol.BMCDriverIPMI
	}
	return Host{Name: e.Machine, Address: e.Address, Port: e.Port, Username: e.Username,
		Password: Secret(e.Password), CipherSuite: e.CipherSuite}, driver, true
}

// Machines lists the machines with a BMC, sorted.
func (s *Store) Machines() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Sorted(maps.Keys(s.hosts))
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }
