package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/pki"
)

// TestRotateSecretsKey: pki rotate-secrets-key refuses while serve holds
// the keyring, and once serve stopped leaves one key, a new one, in
// secrets.key; serve starts on it again.
func TestRotateSecretsKey(t *testing.T) {
	pkiDir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(pkiDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(pkiDir, pki.SecretsKeyFile)
	before, err := pki.OpenKeyring(keyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"--pki", pkiDir, "--data", data, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"}
	cmd, _ := serveChild(t, args...)
	if code, _, errOut := runCLI(t, "", "pki", "rotate-secrets-key", pkiDir, "--data", data); code != 1 || !strings.Contains(errOut, "stop it first") {
		t.Errorf("rotate under a running serve: exit %d, %s", code, errOut)
	}
	stop(t, cmd, syscall.SIGTERM)

	if code, _, errOut := runCLI(t, "", "pki", "rotate-secrets-key", pkiDir); code != 2 || !strings.Contains(errOut, "--data") {
		t.Errorf("rotate without --data: exit %d, %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "", "pki", "rotate-secrets-key", pkiDir, "--data", data)
	if code != 0 {
		t.Fatalf("rotate: exit %d, %s", code, errOut)
	}
	after, err := pki.OpenKeyring(keyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	if ids := after.KeyIDs(); len(ids) != 1 || ids[0] == before.Primary() || !strings.Contains(out, ids[0]) {
		t.Errorf("keyring after the rotation: %v (before %s); printed %q", ids, before.Primary(), out)
	}
	cmd, _ = serveChild(t, args...)
	stop(t, cmd, syscall.SIGTERM)
}
