package pki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeyringRotation: a value sealed under the old primary opens after
// Rotate (both keys held, on disk too) and not after Retire; a new Seal uses
// the new key.
func TestKeyringRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	k, err := OpenKeyring(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("keyring file: %v %v, want mode 0600", fi, err)
	}
	old, err := k.Seal("bmc password", "hunter2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(old, "hunter2") || !strings.HasPrefix(old, SealedPrefix+k.Primary()+":") {
		t.Fatalf("sealed = %q", old)
	}
	if _, err := k.Open("join token", old); err == nil {
		t.Error("a value opened under another label")
	}
	oldID := k.Primary()
	if _, err := k.Rotate(); err != nil {
		t.Fatal(err)
	}
	// A crash here leaves the file with both keys.
	k2, err := OpenKeyring(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k2.Open("bmc password", old); err != nil || got != "hunter2" {
		t.Fatalf("after rotate: %q %v", got, err)
	}
	if !k2.NeedsReseal(old) || k2.Primary() == oldID {
		t.Error("old value not due for a reseal")
	}
	fresh, _ := k2.Seal("bmc password", "hunter2")
	if k2.NeedsReseal(fresh) {
		t.Error("fresh value due for a reseal")
	}
	if err := k2.Retire(); err != nil {
		t.Fatal(err)
	}
	k3, err := OpenKeyring(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k3.Open("bmc password", old); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("old value after retire: %v", err)
	}
	if got, err := k3.Open("bmc password", fresh); err != nil || got != "hunter2" {
		t.Errorf("fresh value after retire: %q %v", got, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKeyring(path, false); err == nil {
		t.Error("a keyring readable by others opened")
	}
}
