package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent/selfupdate"
)

// TestUpdateCmd: bcd update's flags, exit codes and both outputs on a host
// whose records are real files in a temp dir.
func TestUpdateCmd(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	entry := filepath.Join(dir, "bin/bcd")
	os.MkdirAll(data, 0o700)
	os.MkdirAll(filepath.Dir(entry), 0o755)
	os.WriteFile(entry, []byte("#!/bin/sh\n"), 0o755)
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("site = \"fsn1\"\ndata_dir = %q\n[update]\nrelease_sequence = 20\nentrypoint = %q\n", data, entry)), 0o600)
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[update]\nnope = 1\n"), 0o600)

	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"bad output", []string{"-o", "yaml"}, 2, `-o "yaml": want table or json`},
		{"both actions", []string{"--clear-failed", "--rollback"}, 2, "not both"},
		{"an argument", []string{"now"}, 2, "takes no positional arguments"},
		{"a config it refuses", []string{"--config", bad}, 2, "nope"},
		{"nothing to roll back", []string{"--rollback"}, 1, "nothing to roll back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"update", "--config", cfg}, tc.args...)
			code, _, stderr := runBcd(t, args...)
			if code != tc.code || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, stderr %q; want exit %d saying %q", code, stderr, tc.code, tc.says)
			}
		})
	}

	code, out, stderr := runBcd(t, "update", "--config", cfg)
	out = words(out)
	if code != 0 || !strings.Contains(out, "release floor: 20") || !strings.Contains(out, entry+" is a plain file (not adopted") ||
		!strings.Contains(out, "pending update: none") || !strings.Contains(out, "failed versions: none") {
		t.Errorf("table: exit %d\n%s%s", code, out, stderr)
	}

	update := filepath.Join(data, selfupdate.UpdateFile)
	os.WriteFile(update, []byte(`{"floor":21,"failed":[{"version":"0.1.2","reason":"bcd 0.1.2 did not start","at":"2026-03-01T12:00:00Z"}]}`), 0o600)
	code, out, _ = runBcd(t, "update", "--config", cfg, "-o", "json")
	var st selfupdate.Status
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("json: exit %d, %v\n%s", code, err, out)
	}
	if st.Floor != 21 || len(st.Failed) != 1 || st.Failed[0].Version != "0.1.2" || st.Pending != nil || st.Entrypoint != entry {
		t.Errorf("json: %+v", st)
	}
	code, out, _ = runBcd(t, "update", "--config", cfg)
	out = words(out)
	if code != 0 || !strings.Contains(out, "failed versions: 0.1.2 at 2026-03-01T12:00:00Z: bcd 0.1.2 did not start") {
		t.Errorf("table with a failed version: exit %d\n%s", code, out)
	}
	if code, out, _ = runBcd(t, "update", "--config", cfg, "--clear-failed"); code != 0 || out != "cleared 1 failed version(s)\n" {
		t.Errorf("--clear-failed: exit %d, %q", code, out)
	}
	if code, out, _ = runBcd(t, "update", "--config", cfg, "-o", "json"); code != 0 || !strings.Contains(out, `"failed": []`) || !strings.Contains(out, `"pending": null`) {
		t.Errorf("json after --clear-failed: exit %d\n%s", code, out)
	}
}

// words is s with every run of blanks one space: the table's columns align
// with as many as they need.
func words(s string) string { return strings.Join(strings.Fields(s), " ") }
