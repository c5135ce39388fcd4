package site

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/protocol"
)

func TestParseBootSectionSkipsBadEntries(t *testing.T) {
	raw := `{"entries":[
		{"mac":"52:54:00:12:34:56","mode":"ramdisk","kernel":"http://k/vmlinuz","cmdline":"quiet","machine":"m_a"},
		{"mac":"52-54-00-12-34-57","mode":"local"},
		{"mac":"52:54:00:12:34:56","mode":"local"},
		{"mac":"not a mac","mode":"local"},
		{"mac":"52:54:00:12:34:58","mode":"reinstall"}]}`
	tb, err := parseBootSection(json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]boot.Entry{
		"52:54:00:12:34:56": {Mode: boot.ModeRamdisk, Kernel: "http://k/vmlinuz", Cmdline: "quiet"},
		"52:54:00:12:34:57": {Mode: boot.ModeLocal},
	}
	if len(tb.entries) != len(want) {
		t.Fatalf("entries %+v", tb.entries)
	}
	for k, v := range want {
		if tb.entries[k] != v {
			t.Errorf("%s = %+v, want %+v", k, tb.entries[k], v)
		}
	}
	// An older control plane's "machine" key is ignored, not an error.
	if len(tb.skipped) != 3 {
		t.Errorf("skipped %q", tb.skipped)
	}
	if _, err := parseBootSection(json.RawMessage(`{"entries":{}}`)); err == nil {
		t.Error("a section that does not decode was accepted")
	}
}

// TestSavedSpecHasNoBMCPasswords: site-spec.json is 0600, round-trips, and leaves
// bmc_hosts (passwords) to bmc-hosts.json.
func TestSavedSpecHasNoBMCPasswords(t *testing.T) {
	dir := t.TempDir()
	spec := protocol.Spec{Revision: 7, Sections: map[string]json.RawMessage{
		protocol.SectionBoot:     json.RawMessage(`{"entries":[]}`),
		protocol.SectionBMCHosts: json.RawMessage(`{"hosts":[{"machine":"m","address":"10.0.0.9","username":"admin","password":"hunter2"}]}`),
	}}
	if err := saveSpec(dir, spec, time.Now()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, SpecFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v mode %v", path, err, fi.Mode())
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), "hunter2") || strings.Contains(string(b), "bmc_hosts") {
		t.Errorf("site-spec.json holds the BMC hosts:\n%s", b)
	}
	got, err := LoadSpec(dir)
	var compact bytes.Buffer
	if err == nil {
		err = json.Compact(&compact, got.Sections[protocol.SectionBoot])
	}
	if err != nil || got.Revision != 7 || compact.String() != `{"entries":[]}` {
		t.Errorf("LoadSpec = %+v, %v", got, err)
	}
	if got, err := LoadSpec(t.TempDir()); got != nil || err != nil {
		t.Errorf("LoadSpec of an empty dir = %v, %v", got, err)
	}
	os.WriteFile(path, []byte(`{"version":9}`), 0o600)
	if _, err := LoadSpec(dir); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("a future format: %v", err)
	}
}

func TestProxyURL(t *testing.T) {
	for _, c := range []struct{ listen, serverIP, want string }{
		{"10.20.0.2:3128", "", "http://10.20.0.2:3128"},
		{":3128", "10.20.0.2", "http://10.20.0.2:3128"},
		{"0.0.0.0:3128", "10.20.0.2", "http://10.20.0.2:3128"},
		{"0.0.0.0:3128", "", ""},
		{"[::1]:3128", "", "http://[::1]:3128"},
	} {
		if got := proxyURL(c.listen, c.serverIP); got != c.want {
			t.Errorf("proxyURL(%q, %q) = %q, want %q", c.listen, c.serverIP, got, c.want)
		}
	}
}

// FuzzParseSections: the gateway's boot and http_proxy sections never crash the
// site agent, and what parses is what the boot servers accept.
func FuzzParseSections(f *testing.F) {
	for _, s := range []string{
		`{"entries":[{"mac":"52:54:00:12:34:56","mode":"ramdisk"}]}`,
		`{"entries":[{"mac":"52-54-00-12-34-56","mode":"local","machine":"m"},{"mac":"x","mode":""}]}`,
		`{"listen":"10.20.0.2:3128","allow":["images.example:443"]}`,
		`{"listen":":0","allow":["a"]}`,
		`null`, `{}`, `[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if tb, err := parseBootSection(raw); err == nil {
			var table boot.MemTable
			if err := table.Set(tb.entries); err != nil {
				t.Fatalf("a parsed table is refused by the boot servers: %v", err)
			}
		}
		_, _ = parseProxySection(raw)
	})
}

// TestServedMachines: bcd doctor's count of the machines a site serves is the boot
// entries of the spec it saved; none saved says so, and a broken one is an error.
func TestServedMachines(t *testing.T) {
	dir := t.TempDir()
	if n, saved, err := ServedMachines(dir); n != 0 || saved || err != nil {
		t.Errorf("no saved spec: %d, %v, %v; want 0, false, nil", n, saved, err)
	}
	boot, _ := json.Marshal(protocol.BootSection{Entries: []protocol.BootEntry{{MAC: "02:00:00:00:00:01", Mode: protocol.BootRamdisk},
		{MAC: "02:00:00:00:00:02", Mode: protocol.BootLocal}, {MAC: "02:00:00:00:00:03", Mode: protocol.BootRamdisk}}})
	if err := saveSpec(dir, protocol.Spec{Revision: 2, Sections: map[string]json.RawMessage{protocol.SectionBoot: boot}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if n, saved, err := ServedMachines(dir); n != 3 || !saved || err != nil {
		t.Errorf("3 boot entries: %d, %v, %v; want 3, true, nil", n, saved, err)
	}
	if err := saveSpec(dir, protocol.Spec{Revision: 3, Sections: map[string]json.RawMessage{protocol.SectionBoot: json.RawMessage(`{"entries":7}`)}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ServedMachines(dir); err == nil || !strings.Contains(err.Error(), "the boot section of") {
		t.Errorf("a broken boot section: %v, want an error naming it", err)
	}
}
