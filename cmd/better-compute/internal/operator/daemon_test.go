package operator

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/pki"
)

// runCLI runs better-compute with args and returns its exit code and output.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func installArgs(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	return []string{"daemon", "install-script",
		"--pool", "pool_h100", "--site", "fsn1",
		"--gateway-url", "https://gw.eu.example.com",
		"--base-url", "https://compute.example.com",
		"--bcd-version", "0.1.0",
		"--sha256", "amd64=" + strings.Repeat("a", 64) + ",arm64=" + strings.Repeat("b", 64),
		"--pki", dir,
	}
}

// withFlag returns args with flag set to value, replacing it when present.
func withFlag(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

func TestInstallScriptWritesTheScript(t *testing.T) {
	code, out, errOut := runCLI(t, "", installArgs(t)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "#!/bin/sh\n") || !strings.Contains(out, "\nset -eu\n") {
		t.Errorf("not a script:\n%.300s", out)
	}
}

// TestInstallScriptRefusesBadValues: every flag that is embedded in the
// script, given anything outside its pattern, fails with INVALID_INPUT naming
// the flag and exit code 2, and prints no script.
func TestInstallScriptRefusesBadValues(t *testing.T) {
	args := installArgs(t)
	hostile := []string{`a'b`, `a"b`, "$(id)", "`id`", "a\nb", "a b", "a;b", "ünï", ""}
	type flagCase struct {
		flag   string
		values []string
		extra  []string // flags that make the flag apply
	}
	h := strings.Repeat("a", 64)
	pin := "sha256/" + strings.Repeat("A", 43) + "="
	cases := []flagCase{
		{"--pool", append(hostile, "-x", strings.Repeat("p", 64)), nil},
		{"--site", append(hostile, "..x", "a/b"), nil},
		{"--gateway-url", append(prefixed("https://gw.example.com/", hostile[:8]), "", "http://gw.example.com", "https://u:p@gw.example.com",
			"https://gw.example.com/?q=1", "https://gw.example.com/#f", "https://gw.example.com/a/../b", "https://gw.example.com:99999",
			"https://gw.example.com/%2e%2e", "ftp://gw.example.com", "https://gw_example.com"), nil},
		{"--base-url", append(prefixed("https://b.example.com/", hostile[:8]), "", "http://b.example.com", "https://b.example.com/bc?x"), nil},
		{"--bcd-version", append(hostile, "1.0", "latest", "1.0.0/../x", "v1.0.0-$(id)"), nil},
		{"--sha256", append(prefixed("amd64=", hostile), "amd64="+h[:63], "riscv64="+h, "amd64="+h+",amd64="+h, "amd64="+h+";reboot",
			"amd64="+strings.Repeat("g", 64)), nil},
		{"--release-pins", append(hostile, "sha256/abc", pin+" ", pin+","+pin),
			[]string{"--sha256", "", "--release-manifest", "/nonexistent"}},
		{"--attestor", append(hostile[:8], "TPM", "tpm2", "discovery"), nil},
		{"--privileged-plugins", append(hostile[:8], "a,,b", ".", "..", "a/b", "kata,kata"), nil},
		{"--install-plugins", append(hostile[:8], "bcx-redfish", "..", "bcx-ipmi,bcx-ipmi"), nil},
		{"--instance-bridges", append(hostile[:8], "averyveryverylongbridge", "br0,,br1", "br/0"), []string{"--unprivileged", "true"}},
		{"--proxy-ca-file", []string{"/nonexistent/ca.pem"}, nil},
		{"--pki", []string{"/nonexistent/pki", ""}, nil},
	}
	for _, c := range cases {
		for _, v := range c.values {
			name := c.flag + "=" + v
			t.Run(name, func(t *testing.T) {
				a := withFlag(args, c.flag, v)
				for i := 0; i+1 < len(c.extra); i += 2 {
					if c.extra[i] == "--unprivileged" {
						a = append(a, "--unprivileged")
						continue
					}
					a = withFlag(a, c.extra[i], c.extra[i+1])
				}
				code, out, errOut := runCLI(t, "", a...)
				if code != 2 {
					t.Errorf("exit %d, want 2 (stderr %q)", code, errOut)
				}
				if out != "" {
					t.Errorf("printed a script for a refused value")
				}
				if !strings.Contains(errOut, "INVALID_INPUT: "+c.flag+": ") && !(v == "" && strings.Contains(errOut, "INVALID_INPUT: ")) {
					t.Errorf("stderr %q does not name %s with INVALID_INPUT", errOut, c.flag)
				}
			})
		}
	}
}

func prefixed(prefix string, values []string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = prefix + v
	}
	return out
}

func TestReleaseCommands(t *testing.T) {
	dir := t.TempDir()
	dist := filepath.Join(dir, "dist")
	if err := os.Mkdir(dist, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bcd_0.3.0_linux_amd64", "bcd_0.3.0_linux_arm64", "checksums.txt"} {
		if err := os.WriteFile(filepath.Join(dist, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var pins []string
	for _, k := range []string{"k1", "k2", "k3"} {
		code, out, errOut := runCLI(t, "", "release", "keygen", "--out", filepath.Join(dir, k))
		if code != 0 {
			t.Fatalf("keygen: %d %s", code, errOut)
		}
		pin := strings.TrimSpace(out)
		if _, err := pki.ParsePin(pin); err != nil {
			t.Fatalf("keygen printed %q: %v", out, err)
		}
		pins = append(pins, pin)
	}
	if code, _, errOut := runCLI(t, "", "release", "keygen", "--out", filepath.Join(dir, "k1")); code != 1 || !strings.Contains(errOut, "already exists") {
		t.Errorf("keygen over an existing key: %d %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "", "release", "sign", "--product", "bcd", "--version", "0.3.0", "--sequence", "5",
		"--expires", "30d", "--key", filepath.Join(dir, "k1"), "--key", filepath.Join(dir, "k3"), dist)
	if code != 0 {
		t.Fatalf("sign: %d %s", code, errOut)
	}
	if !strings.Contains(out, "3 artifacts, 2 signature(s)") {
		t.Errorf("sign said %q", out)
	}
	manifest := filepath.Join(dist, "manifest.json")
	all := strings.Join(pins, ",")
	for _, tc := range []struct {
		args []string
		code int
		text string
	}{
		{[]string{"--pins", all, "--threshold", "2", "--version", "0.3.0", "--min-sequence", "5"}, 0, "OK: bcd 0.3.0 sequence 5, 3 artifacts"},
		{[]string{"--pins", all, "--threshold", "3"}, 1, "RELEASE_UNTRUSTED: "},
		{[]string{"--pins", pins[1], "--threshold", "1"}, 1, "RELEASE_UNTRUSTED: "},
		{[]string{"--pins", all, "--threshold", "1", "--version", "0.3.1"}, 1, "RELEASE_MISMATCH: "},
		{[]string{"--pins", all, "--threshold", "1", "--product", "bcx-ipmi"}, 1, "RELEASE_MISMATCH: "},
		{[]string{"--pins", all, "--threshold", "1", "--min-sequence", "6"}, 1, "RELEASE_ROLLBACK: "},
		{[]string{"--pins", all, "--threshold", "4"}, 2, "INVALID_INPUT: "},
		{[]string{"--pins", "sha256/x", "--threshold", "1"}, 2, "INVALID_INPUT: "},
	} {
		code, out, errOut := runCLI(t, "", append(append([]string{"release", "verify"}, tc.args...), manifest)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.text) {
			t.Errorf("verify %v: exit %d, %q %q; want %d and %q", tc.args, code, out, errOut, tc.code, tc.text)
		}
	}
	// The manifest does not list itself, and re-signing replaces it.
	if code, out, _ := runCLI(t, "", "release", "sign", "--product", "bcd", "--version", "0.3.0", "--sequence", "6",
		"--expires", "2099-01-01T00:00:00Z", "--key", filepath.Join(dir, "k2"), dist); code != 0 || !strings.Contains(out, "3 artifacts") {
		t.Errorf("re-sign: %d %q", code, out)
	}
	for _, bad := range [][]string{
		{"--version", "latest"}, {"--sequence", "0"}, {"--expires", "yesterday"}, {"--expires", "2000-01-01T00:00:00Z"},
	} {
		args := []string{"release", "sign", "--product", "bcd", "--version", "0.3.0", "--sequence", "7", "--expires", "1h",
			"--key", filepath.Join(dir, "k1")}
		args = withFlag(args, bad[0], bad[1])
		if code, _, errOut := runCLI(t, "", append(args, dist)...); code != 2 || !strings.Contains(errOut, "INVALID_INPUT") {
			t.Errorf("sign %v: exit %d %s", bad, code, errOut)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "k1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI(t, "", "release", "sign", "--product", "bcd", "--version", "0.3.0", "--sequence", "7",
		"--expires", "1h", "--key", filepath.Join(dir, "k1"), dist); code != 1 || !strings.Contains(errOut, "0600") {
		t.Errorf("sign with a readable key: %d %s", code, errOut)
	}
}
