package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
)

func runBcd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestConfigCheck: the operator's `nginx -t` prints OK or FILE:LINE: message per error.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(good, []byte("site = \"fsn1\"\n[log]\nlevel = \"debug\"\n"), 0o600)
	os.WriteFile(bad, []byte("site = \"fsn1\"\n\n[log]\nlevel = 3\nnope = true\n"), 0o600)

	code, out, _ := runBcd(t, "config", "check", "--config", good)
	if code != 0 || out != "OK\n" {
		t.Errorf("good file: exit %d, output %q", code, out)
	}
	code, out, _ = runBcd(t, "config", "check", "--config", bad)
	if code != 1 {
		t.Errorf("bad file: exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], bad+":4: ") || !strings.HasPrefix(lines[1], bad+":5: ") {
		t.Errorf("bad file: output %q, want one FILE:LINE: line for lines 4 and 5", out)
	}
	code, _, _ = runBcd(t, "config", "check", "--config", filepath.Join(dir, "missing.toml"))
	if code != 1 {
		t.Errorf("missing file: exit %d, want 1", code)
	}
	if code, _, _ := runBcd(t, "config", "check", "extra"); code != 2 {
		t.Errorf("extra argument: exit %d, want 2", code)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runBcd(t, "version")
	if code != 0 || !strings.HasPrefix(out, "bcd ") {
		t.Errorf("bcd version: exit %d, output %q", code, out)
	}
}

// TestConfigCheckCapsItsOutput: a file with thousands of problems prints the first
// config.MaxCheckProblems and a line counting the rest (9,000 bad sections
// printed 566 KB before).
func TestConfigCheckCapsItsOutput(t *testing.T) {
	var doc strings.Builder
	for range 9000 {
		doc.WriteString("[a]\n")
	}
	if doc.Len() > config.MaxSize {
		t.Fatalf("the test file is %d bytes, over the limit", doc.Len())
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(doc.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runBcd(t, "config", "check", "--config", p)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 1 || len(lines) != config.MaxCheckProblems+1 {
		t.Fatalf("exit %d, %d lines (%d bytes), want 1 and %d lines", code, len(lines), len(out), config.MaxCheckProblems+1)
	}
	if !strings.HasPrefix(lines[0], p+":1: ") || !strings.HasPrefix(lines[config.MaxCheckProblems-1], p+":100: ") {
		t.Errorf("not the first problems in order: %q … %q", lines[0], lines[config.MaxCheckProblems-1])
	}
	if want := p + ": 8900 more problems not shown (9000 in all)"; !strings.HasPrefix(lines[config.MaxCheckProblems], want) {
		t.Errorf("last line %q, want it to start %q", lines[config.MaxCheckProblems], want)
	}
}
