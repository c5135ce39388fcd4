package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mkfifo makes a real FIFO at path.
func mkfifo(t *testing.T, path string) string {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runPrompt runs bcd with args and fails the test when it has not returned within
// a generous bound: a command that opens a FIFO for reading without O_NONBLOCK
// waits for a writer forever, and one that accepts what it should refuse runs on.
// On a hang it opens the FIFOs for writing, which releases a blocked open, so a
// command stuck there does not outlive the test.
func runPrompt(t *testing.T, fifos []string, args ...string) (int, string) {
	t.Helper()
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		code := run(args, strings.NewReader(""), &out, &out)
		done <- result{code, out.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out
	case <-time.After(20 * time.Second):
		for _, p := range fifos {
			if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
		select {
		case r := <-done:
			t.Fatalf("bcd %q blocked on a FIFO (released by opening it for writing; exit %d)\n%s", args, r.code, r.out)
		case <-time.After(5 * time.Second):
			t.Fatalf("bcd %q did not return", args)
		}
		return 0, ""
	}
}

// TestCommandsRefuseAConfigThatIsNotAFile: a config.toml that is a FIFO, a
// directory or a device is refused at once by every command that reads it, with
// the path and what it is; before, a FIFO hung each of them, and bcd join did not
// even stop on SIGTERM while it waited.
func TestCommandsRefuseAConfigThatIsNotAFile(t *testing.T) {
	for _, kind := range []struct {
		name, what string
		make       func(t *testing.T) string
	}{
		{"fifo", "a FIFO", func(t *testing.T) string { return mkfifo(t, filepath.Join(t.TempDir(), "config.toml")) }},
		{"directory", "a directory", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "config.toml")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"device", "a device", func(*testing.T) string { return os.DevNull }},
	} {
		for _, cmd := range [][]string{{"join"}, {"doctor"}, {"node"}, {"site"}, {"config", "check"}} {
			t.Run(kind.name+"/"+strings.Join(cmd, " "), func(t *testing.T) {
				path := kind.make(t)
				code, out := runPrompt(t, []string{path}, append(cmd, "--config", path)...)
				if code == 0 {
					t.Errorf("exit 0, want a refusal\n%s", out)
				}
				if want := path + ": not a regular file (" + kind.what + ")"; !strings.Contains(out, want) {
					t.Errorf("output does not say %q:\n%s", want, out)
				}
			})
		}
	}
}

// TestJoinRefusesFilesThatAreNotFiles: the join's other inputs, the token file and
// join-encryption.jwk, are refused the same way when they are FIFOs.
func TestJoinRefusesFilesThatAreNotFiles(t *testing.T) {
	t.Run("token file", func(t *testing.T) {
		f := newCLIFixture(t)
		tok := mkfifo(t, filepath.Join(t.TempDir(), "join-token"))
		code, out := runPrompt(t, []string{tok}, "join", "--config", f.cfgPath, "--token-file", tok)
		if code == 0 || !strings.Contains(out, tok) || !strings.Contains(out, "a FIFO") {
			t.Errorf("exit %d, want a refusal naming %s and a FIFO:\n%s", code, tok, out)
		}
	})
	t.Run("join-encryption.jwk", func(t *testing.T) {
		f := newCLIFixture(t)
		jwk := filepath.Join(f.etc, "join-encryption.jwk")
		if err := os.Remove(jwk); err != nil {
			t.Fatal(err)
		}
		mkfifo(t, jwk)
		// A token, so that the join reaches the key.
		tok := filepath.Join(t.TempDir(), "join-token")
		if err := os.WriteFile(tok, []byte("bcjt_cli_token\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out := runPrompt(t, []string{jwk}, "join", "--config", f.cfgPath, "--token-file", tok)
		if code == 0 || !strings.Contains(out, jwk+": not a regular file (a FIFO)") {
			t.Errorf("exit %d, want a refusal naming %s as a FIFO:\n%s", code, jwk, out)
		}
	})
}

// TestNodeAndDoctorRefuseAKeyOrJournalThatIsNotAFile: after a join, node.key or
// journal.db replaced by a FIFO or a directory stops bcd node promptly, naming the
// file, and a node.key so replaced fails bcd doctor (whose tpm check read it with
// a plain open and hung); the doctor does not open the journal.
func TestNodeAndDoctorRefuseAKeyOrJournalThatIsNotAFile(t *testing.T) {
	for _, c := range []struct{ file, kind, what string }{
		{"node.key", "fifo", "a FIFO"},
		{"journal.db", "fifo", "a FIFO"},
		{"journal.db", "directory", "a directory"},
	} {
		t.Run(c.file+"/"+c.kind, func(t *testing.T) {
			f := newCLIFixture(t)
			if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
				t.Fatalf("join: %d %s %s", code, out, errOut)
			}
			p := filepath.Join(f.dataDir, c.file)
			os.Remove(p)
			if c.kind == "fifo" {
				mkfifo(t, p)
			} else if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			want := p + ": not a regular file (" + c.what + ")"
			code, out := runPrompt(t, []string{p}, "node", "--config", f.cfgPath)
			if code == 0 || !strings.Contains(out, want) {
				t.Errorf("bcd node: exit %d, want a refusal with %q:\n%s", code, want, out)
			}
			if c.file != "node.key" {
				return
			}
			code, out = runPrompt(t, []string{p}, "doctor", "--config", f.cfgPath)
			if code == 0 || !strings.Contains(out, want) || strings.Contains(out, "tpm: ok") {
				t.Errorf("bcd doctor: exit %d, want a failure with %q:\n%s", code, want, out)
			}
		})
	}
}

// TestDataDirOthersCanWriteIsRefused: a data_dir that exists with group or other
// write (systemd makes it 0700) is refused by the commands that keep the node's
// key, identity and journal there, with its path and mode, and left as it is;
// before, a 0777 data_dir was joined into and used.
func TestDataDirOthersCanWriteIsRefused(t *testing.T) {
	f := newCLIFixture(t)
	if err := os.Mkdir(f.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.dataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	want := "data_dir " + f.dataDir + ": mode 0777 lets group or others write in it"
	tok := filepath.Join(t.TempDir(), "join-token")
	if err := os.WriteFile(tok, []byte("bcjt_cli_token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"join", "--config", f.cfgPath, "--token-file", tok},
		{"node", "--config", f.cfgPath},
		{"site", "--config", f.cfgPath},
		{"doctor", "--config", f.cfgPath},
	} {
		code, out := runPrompt(t, nil, args...)
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("bcd %s: exit %d, want a refusal with %q:\n%s", args[0], code, want, out)
		}
	}
	if ents, _ := os.ReadDir(f.dataDir); len(ents) != 0 {
		t.Errorf("something was written into the refused data_dir: %v", ents)
	}
	if fi, err := os.Stat(f.dataDir); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("the refused data_dir was changed: %v %v", fi.Mode(), err)
	}

	// The status socket's directory (systemd's RuntimeDirectory, 0700) too.
	if err := os.Chmod(f.dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	run := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(run, 0o733); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(f.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(f.dataDir, "bcd.sock")
	cfg = []byte(strings.Replace(string(cfg), sock, filepath.Join(run, "bcd.sock"), 1))
	if err := os.WriteFile(f.cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runPrompt(t, nil, "node", "--config", f.cfgPath)
	if want := run + ": mode 0733 lets group or others write in it"; code == 0 || !strings.Contains(out, want) {
		t.Errorf("bcd node with socket_path in a 0733 directory: exit %d, want a refusal with %q:\n%s", code, want, out)
	}
}
