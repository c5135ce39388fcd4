package nodeagent

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/config"
)

// updateHost is a host's self-update files in a temp dir: config.toml with
// [update], the entrypoint, the slots and the records, written as bcd writes
// them.
type updateHost struct {
	dir, cfgPath, data, slots, entry string
}

func newUpdateHost(t *testing.T, pins bool) *updateHost {
	t.Helper()
	dir := t.TempDir()
	h := &updateHost{dir: dir, cfgPath: filepath.Join(dir, "config.toml"), data: filepath.Join(dir, "data"),
		entry: filepath.Join(dir, "usr/local/bin/bcd")}
	h.slots = filepath.Join(h.data, "bin")
	sum := sha256.Sum256([]byte("release key"))
	update := fmt.Sprintf("\n[update]\nentrypoint = %q\n", h.entry)
	if pins {
		update += fmt.Sprintf("release_pins = %q\nrelease_sequence = 20\n", "sha256/"+base64.StdEncoding.EncodeToString(sum[:]))
	}
	cfg := fmt.Sprintf("gateway_url = \"https://127.0.0.1:1\"\nserving_ca_spki_pin = %q\ndata_dir = %q\n%s",
		"sha256/"+base64.StdEncoding.EncodeToString(sum[:]), h.data, update)
	for _, d := range []string{h.slots, filepath.Dir(h.entry)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(h.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.write(t, h.entry, "#!/bin/sh\n", 0o755) // what the install script leaves
	return h
}

func (h *updateHost) write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func (h *updateHost) link(t *testing.T, path, target string) {
	t.Helper()
	os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// adopted is the host after a first update: bcd-a 0.1.0 and bcd-b 0.1.1,
// current → bcd-b, previous → bcd-a, the entrypoint linked to current.
func (h *updateHost) adopted(t *testing.T) {
	t.Helper()
	digest := strings.Repeat("ab", 32)
	h.write(t, filepath.Join(h.slots, "bcd-a"), "a", 0o755)
	h.write(t, filepath.Join(h.slots, "bcd-b"), "b", 0o755)
	h.write(t, filepath.Join(h.slots, "slots.json"), `{"slots":{"a":{"version":"0.1.0","sequence":20,"sha256":"`+digest+`","size":1},"b":{"version":"0.1.1","sequence":21,"sha256":"`+digest+`","size":1}}}`, 0o644)
	h.link(t, filepath.Join(h.slots, "current"), "bcd-b")
	h.link(t, filepath.Join(h.slots, "previous"), "bcd-a")
	h.link(t, h.entry, filepath.Join(h.slots, "current"))
	h.write(t, filepath.Join(h.data, "update.json"), `{"floor":21,"failed":null}`, 0o600)
}

func TestDoctorUpdate(t *testing.T) {
	deadline := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name  string
		pins  bool
		setup func(t *testing.T, h *updateHost)
		level Level
		says  []string
	}{
		{"no release pins", false, nil, Warn, []string{"no [update] release_pins"}},
		{"pins, slots unused", true, nil, OK, []string{"1 release pin(s), release floor 20", "unused until the first update"}},
		{"adopted and linked", true, func(t *testing.T, h *updateHost) { h.adopted(t) }, OK,
			[]string{"links to ", "bcd 0.1.1 in bcd-b", "release floor 21"}},
		{"the install script put a plain file back", true, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			os.Remove(h.entry)
			h.write(t, h.entry, "#!/bin/sh\n", 0o755)
		}, Fail, []string{"are in use", "is a plain file", "adopts the file into the current slot"}},
		{"the entrypoint links elsewhere", true, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			h.link(t, h.entry, filepath.Join(h.slots, "bcd-a"))
		}, Fail, []string{"are in use", "links to " + "X", "not "}},
		{"pending update", true, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			h.write(t, filepath.Join(h.data, "upgrade.json"), `{"version":"0.1.1","sequence":21,"from_slot":"a","to_slot":"b","from_version":"0.1.0","deadline":"`+deadline+`","revision":3,"started":"`+deadline+`"}`, 0o600)
		}, Warn, []string{"an update to bcd 0.1.1 awaits its first Welcome until " + deadline}},
		{"failed version", true, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			h.write(t, filepath.Join(h.data, "update.json"), `{"floor":21,"failed":[{"version":"0.1.2","reason":"bcd 0.1.2 did not start","at":"`+deadline+`"}]}`, 0o600)
		}, Warn, []string{"1 failed version(s)", "bcd update --clear-failed", "0.1.2"}},
		{"no pins and a failed version: both said", false, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			h.write(t, filepath.Join(h.data, "update.json"), `{"floor":21,"failed":[{"version":"0.1.2","reason":"x","at":"`+deadline+`"}]}`, 0o600)
		}, Warn, []string{"no [update] release_pins", "; 1 failed version(s)"}},
		{"slots.json is not bcd's", true, func(t *testing.T, h *updateHost) {
			h.adopted(t)
			h.write(t, filepath.Join(h.slots, "slots.json"), `{"slots":{"c":{}}}`, 0o644)
		}, Fail, []string{"do not read", "slots.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newUpdateHost(t, tc.pins)
			if tc.setup != nil {
				tc.setup(t, h)
			}
			cfg, err := config.Load(h.cfgPath, config.ParseOptions{})
			if err != nil {
				t.Fatal(err)
			}
			r := checkUpdate(cfg, h.cfgPath)
			if r.Level != tc.level {
				t.Errorf("level %s, want %s: %s", r.Level, tc.level, r.Detail)
			}
			for _, want := range tc.says {
				want = strings.ReplaceAll(want, "X", filepath.Join(h.slots, "bcd-a"))
				if !strings.Contains(r.Detail, want) {
					t.Errorf("detail %q lacks %q", r.Detail, want)
				}
			}
		})
	}
}

// TestWriteUpdateStatus: bcd update's table of an updated host, a pending
// update and a failed version.
func TestWriteUpdateStatus(t *testing.T) {
	h := newUpdateHost(t, true)
	h.adopted(t)
	deadline := "2026-03-01T12:02:00Z"
	h.write(t, filepath.Join(h.data, "upgrade.json"), `{"version":"0.1.2","sequence":22,"from_slot":"b","to_slot":"a","from_version":"0.1.1","deadline":"`+deadline+`","command_id":"cmd_1","revision":0,"started":"`+deadline+`"}`, 0o600)
	h.write(t, filepath.Join(h.data, "update.json"), `{"floor":21,"failed":[{"version":"0.1.0","reason":"bcd 0.1.0 did not start","at":"`+deadline+`"}]}`, 0o600)
	cfg, err := config.Load(h.cfgPath, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := UpdateManager(cfg, h.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.Status()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteUpdateStatus(&b, st); err != nil {
		t.Fatal(err)
	}
	out := strings.Join(strings.Fields(b.String()), " ")
	for _, want := range []string{
		h.entry + " links to " + filepath.Join(h.slots, "current"),
		"release floor: 21",
		"SLOT VERSION SEQUENCE SIZE SHA256 LINKS bcd-a 0.1.0 20 1 B abababababababab… previous bcd-b 0.1.1 21 1 B abababababababab… current",
		"pending update: bcd 0.1.2 (sequence 22) in bcd-a, awaiting its first Welcome until " + deadline + " (daemon.upgrade cmd_1)",
		"failed versions: 0.1.0 at " + deadline + ": bcd 0.1.0 did not start bcd update --clear-failed allows them again",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
