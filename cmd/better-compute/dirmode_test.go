package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
)

// openDir makes a directory group and others may write in (chmod: Mkdir's mode
// is narrowed by the umask).
func openDir(t *testing.T, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// runBounded runs better-compute in process; a serve that accepted its
// directories would listen until stopped, so a bound ends the test instead.
func runBounded(t *testing.T, args ...string) (int, string) {
	t.Helper()
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runCLI(t, "", args...)
		done <- result{code, out + errOut}
	}()
	select {
	case r := <-done:
		return r.code, r.out
	case <-time.After(30 * time.Second):
		t.Fatalf("better-compute %q did not refuse its directory: it is still running", args)
		return 0, ""
	}
}

// TestDirectoriesOthersCanWriteAreRefused: serve's --data and --pki and
// pki init's directory, when they exist with group or other write, are refused
// with the path and the mode, and left as they were (before, --data 0777 was
// used as it was, and pki init chmodded it to 0700 and wrote the keys in).
func TestDirectoriesOthersCanWriteAreRefused(t *testing.T) {
	good := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(good, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	listen := []string{"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"}

	t.Run("serve --data", func(t *testing.T) {
		data := openDir(t, 0o777)
		code, out := runBounded(t, append([]string{"serve", "--pki", good, "--data", data}, listen...)...)
		want := fmt.Sprintf("%s: mode 0777 lets group or others write in it", data)
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, want a refusal with %q:\n%s", code, want, out)
		}
		if ents, _ := os.ReadDir(data); len(ents) != 0 {
			t.Errorf("serve wrote into the refused directory: %v", ents)
		}
	})
	t.Run("serve --pki", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "pki")
		if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o770); err != nil {
			t.Fatal(err)
		}
		code, out := runBounded(t, append([]string{"serve", "--pki", dir, "--data", filepath.Join(t.TempDir(), "data")}, listen...)...)
		want := fmt.Sprintf("%s: mode 0770 lets group or others write in it", dir)
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, want a refusal with %q:\n%s", code, want, out)
		}
	})
	t.Run("pki init", func(t *testing.T) {
		dir := openDir(t, 0o777)
		code, out := runBounded(t, "pki", "init", dir)
		want := fmt.Sprintf("%s: mode 0777 lets group or others write in it", dir)
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("exit %d, want a refusal with %q:\n%s", code, want, out)
		}
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm() != 0o777 {
			t.Errorf("the refused directory was changed: %v %v", fi.Mode(), err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("pki init wrote into the refused directory: %v", ents)
		}
	})
}
