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

// hostsFileVersion is the format of bmc-hosts.json.
const hostsFileVersion = 1

type hostsFile struct {
	Version int                `json:"version"`
	Hosts   []protocol.BMCHost `json:"hosts"`
}

// Store keeps the site's BMC hosts from its desired state in bmc-hosts.json (0600,
// replaced atomically), so a restarted site agent can drive BMCs before the control
// plane answers. It is safe for concurrent use.
type Store struct {
	path  string
	mu    sync.RWMutex
	hosts map[string]protocol.BMCHost
}

// OpenStore reads <dataDir>/bmc-hosts.json, or starts empty when there is none. A
// file that group or others may access is refused: it holds BMC passwords, and one
// that has been readable must be treated as leaked.
func OpenStore(dataDir string) (*Store, error) {
	s := &Store{path: filepath.Join(dataDir, HostsFile), hosts: map[string]protocol.BMCHost{}}
	b, err := secretfile.Read(s.path, secretfile.Options{Limit: MaxHostsSize, Private: true, What: "BMC passwords (treat them as leaked)", NoFollow: true})
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bmc hosts: %w", err)
	}
	var hf hostsFile
	if err := json.Unmarshal(b, &hf); err != nil {
		return nil, fmt.Errorf("bmc hosts: %s: %w", s.path, JSONError(err))
	}
	if hf.Version != hostsFileVersion {
		return nil, fmt.Errorf("bmc hosts: %s has version %d, this bcd reads version %d", s.path, hf.Version, hostsFileVersion)
	}
	sec := protocol.BMCHostsSection{Hosts: hf.Hosts}
	if err := sec.Validate(); err != nil {
		return nil, fmt.Errorf("bmc hosts: %s: %w", s.path, err)
	}
	for _, h := range hf.Hosts {
		s.hosts[h.Machine] = h
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
	b, err := encodeHosts(next)
	if err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(s.path, b, 0o600); err != nil {
		return fmt.Errorf("bmc hosts: %w", err)
	}
	s.hosts = next
	return nil
}

func encodeHosts(m map[string]protocol.BMCHost) ([]byte, error) {
	hf := hostsFile{Version: hostsFileVersion, Hosts: make([]protocol.BMCHost, 0, len(m))}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		hf.Hosts = append(hf.Hosts, m[name])
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
