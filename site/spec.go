package site

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// SpecFile is where, under data_dir, the site agent keeps the last spec the gateway
// sent, so that a restart during a gateway outage still boots machines.
const SpecFile = "site-spec.json"

// specFileVersion is the format of SpecFile.
const specFileVersion = 1

// savedSpec is SpecFile. The bmc_hosts section is left out: its passwords live in
// bmc-hosts.json only.
type savedSpec struct {
	Version    int           `json:"version"`
	ReceivedAt time.Time     `json:"received_at"`
	Spec       protocol.Spec `json:"spec"`
}

// withoutSecrets is spec without the sections SpecFile must not hold.
func withoutSecrets(spec protocol.Spec) protocol.Spec {
	out := protocol.Spec{Revision: spec.Revision}
	for name, raw := range spec.Sections {
		if name == protocol.SectionBMCHosts {
			continue
		}
		if out.Sections == nil {
			out.Sections = map[string]json.RawMessage{}
		}
		out.Sections[name] = raw
	}
	return out
}

// LoadSpec reads <dataDir>/site-spec.json; (nil, nil) when there is none.
func LoadSpec(dataDir string) (*protocol.Spec, error) {
	path := filepath.Join(dataDir, SpecFile)
	// secretfile: a FIFO there must not hang bcd site's start.
	data, err := secretfile.Read(path, secretfile.Options{Limit: agent.MaxFrameSize})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("saved spec: %w", err)
	}
	var s savedSpec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("saved spec: %s is not valid JSON: %w", path, err)
	}
	if s.Version != specFileVersion {
		return nil, fmt.Errorf("saved spec: %s has version %d, this bcd reads version %d", path, s.Version, specFileVersion)
	}
	return &s.Spec, nil
}

// ServedMachines counts the machines the site serves by the spec it saved in
// dataDir (the boot table's entries, one a MAC), and says whether it saved one:
// bcd doctor's neighbours check.
func ServedMachines(dataDir string) (machines int, saved bool, err error) {
	spec, err := LoadSpec(dataDir)
	if err != nil || spec == nil {
		return 0, false, err
	}
	raw, ok := spec.Sections[protocol.SectionBoot]
	if !ok {
		return 0, true, nil
	}
	var boot protocol.BootSection
	if err := json.Unmarshal(raw, &boot); err != nil {
		return 0, true, fmt.Errorf("saved spec: the boot section of %s does not parse: %w", filepath.Join(dataDir, SpecFile), err)
	}
	return len(boot.Entries), true, nil
}

// saveSpec writes spec (without bmc_hosts) to <dataDir>/site-spec.json, 0600 and
// atomically, unless the file already holds the same spec.
func saveSpec(dataDir string, spec protocol.Spec, now time.Time) error {
	spec = withoutSecrets(spec)
	path := filepath.Join(dataDir, SpecFile)
	if old, err := LoadSpec(dataDir); err == nil && old != nil {
		a, _ := json.Marshal(old)
		b, _ := json.Marshal(spec)
		if bytes.Equal(a, b) {
			return nil
		}
	}
	data, err := json.MarshalIndent(savedSpec{Version: specFileVersion, ReceivedAt: now.UTC(), Spec: spec}, "", "  ")
	if err != nil {
		return fmt.Errorf("saved spec: %w", err)
	}
	if err := pki.WriteFileAtomic(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("saved spec: %w", err)
	}
	return nil
}

// bootTable is a boot section turned into what the boot servers look up.
type bootTable struct {
	entries map[string]boot.Entry
	skipped []string // why entries were left out
}

// parseBootSection decodes a boot section. An entry that is wrong is left out (and
// said why in skipped) rather than failing the whole table: one machine's mistake
// must not stop a site from booting the others.
func parseBootSection(raw json.RawMessage) (*bootTable, error) {
	var sec protocol.BootSection
	if err := json.Unmarshal(raw, &sec); err != nil {
		return nil, fmt.Errorf("boot section: %w", err)
	}
	t := &bootTable{entries: map[string]boot.Entry{}}
	for i, e := range sec.Entries {
		mac, err := protocol.ParseMAC(e.MAC)
		if err != nil {
			t.skipped = append(t.skipped, fmt.Sprintf("entry %d: %v", i, err))
			continue
		}
		key := mac.String()
		if _, dup := t.entries[key]; dup {
			t.skipped = append(t.skipped, fmt.Sprintf("entry %d: MAC %s is listed twice (the first entry is used)", i, key))
			continue
		}
		switch e.Mode {
		case protocol.BootRamdisk:
			t.entries[key] = boot.Entry{Mode: boot.ModeRamdisk, Kernel: e.Kernel, Initrd: e.Initrd, Cmdline: e.Cmdline}
		case protocol.BootLocal:
			t.entries[key] = boot.Entry{Mode: boot.ModeLocal}
		default:
			t.skipped = append(t.skipped, fmt.Sprintf("entry %d (%s): mode %q is neither %q nor %q", i, key, e.Mode, protocol.BootRamdisk, protocol.BootLocal))
			continue
		}
	}
	return t, nil
}

// parseProxySection decodes an http_proxy section and checks its addresses.
func parseProxySection(raw json.RawMessage) (*protocol.HTTPProxySection, error) {
	var sec protocol.HTTPProxySection
	if err := json.Unmarshal(raw, &sec); err != nil {
		return nil, fmt.Errorf("http_proxy section: %w", err)
	}
	if _, port, err := net.SplitHostPort(sec.Listen); err != nil || port == "" || port == "0" {
		return nil, fmt.Errorf("http_proxy section: listen %q is not host:port", sec.Listen)
	}
	for _, a := range sec.Allow {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" || strings.ContainsAny(a, "/ ") {
			return nil, fmt.Errorf("http_proxy section: allowed destination %q is not host:port", a)
		}
	}
	return &sec, nil
}
