package operator

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func runBC(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestPKIInitAndPins: init prints the pins, pins prints the same three config lines,
// and a second init into the same directory is refused.
func TestPKIInitAndPins(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	code, initOut, stderr := runBC(t, "pki", "init", dir)
	if code != 0 {
		t.Fatalf("pki init: exit %d: %s", code, stderr)
	}
	code, pinsOut, stderr := runBC(t, "pki", "pins", dir)
	if code != 0 {
		t.Fatalf("pki pins: exit %d: %s", code, stderr)
	}
	want := regexp.MustCompile(`^serving_ca_spki_pin = "sha256/[A-Za-z0-9+/]{43}="\njoin_signing_key_pin = "sha256/[A-Za-z0-9+/]{43}="\njoin_encryption_key_pin = "sha256/[A-Za-z0-9+/]{43}="\n$`)
	if !want.MatchString(pinsOut) {
		t.Errorf("pki pins output %q", pinsOut)
	}
	if !strings.Contains(initOut, pinsOut) {
		t.Errorf("pki init did not print the same pins:\n%s", initOut)
	}
	if code, _, stderr := runBC(t, "pki", "init", dir); code != 1 || !strings.Contains(stderr, "refusing to overwrite") {
		t.Errorf("second pki init: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ := runBC(t, "pki", "init"); code != 2 {
		t.Errorf("pki init without DIR: exit %d, want 2", code)
	}
}
