package join

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestTokenFileRules(t *testing.T) {
	const tok = "bcjt_jt_secretvalue"
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the path to give
		want  string                                // "" for success, else part of the error
	}{
		{"0600 ok", func(t *testing.T, dir string) string { return write(t, dir, "t", tok+"\n", 0o600) }, ""},
		{"0400 ok", func(t *testing.T, dir string) string { return write(t, dir, "t", tok, 0o400) }, ""},
		{"0644 refused", func(t *testing.T, dir string) string { return write(t, dir, "t", tok, 0o644) }, "mode 0644"},
		{"0640 refused", func(t *testing.T, dir string) string { return write(t, dir, "t", tok, 0o640) }, "mode 0640"},
		{"0700 refused", func(t *testing.T, dir string) string { return write(t, dir, "t", tok, 0o700) }, "mode 0700"},
		{"directory refused", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "d")
			os.Mkdir(p, 0o700)
			return p
		}, "is a directory"},
		{"FIFO refused", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, "FIFO"},
		{"over 4 KiB refused", func(t *testing.T, dir string) string {
			return write(t, dir, "t", strings.Repeat("a", MaxTokenSize+1), 0o600)
		}, "limit"},
		{"exactly 4 KiB ok", func(t *testing.T, dir string) string {
			return write(t, dir, "t", strings.Repeat("a", MaxTokenSize), 0o600)
		}, ""},
		{"missing", func(t *testing.T, dir string) string { return filepath.Join(dir, "nothing") }, "no such file"},
		{"Kubernetes ..data layout ok", func(t *testing.T, dir string) string {
			ts := filepath.Join(dir, "..2025_01_02_03_04_05.123456789")
			os.Mkdir(ts, 0o755)
			write(t, ts, "join-token", tok, 0o400)
			symlink(t, "..2025_01_02_03_04_05.123456789", filepath.Join(dir, "..data"))
			symlink(t, "..data/join-token", filepath.Join(dir, "join-token"))
			return filepath.Join(dir, "join-token")
		}, ""},
		{"symlink out of the directory refused", func(t *testing.T, dir string) string {
			outside := write(t, t.TempDir(), "t", tok, 0o600)
			symlink(t, outside, filepath.Join(dir, "join-token"))
			return filepath.Join(dir, "join-token")
		}, "only point within its own directory"},
		{"relative symlink climbing out refused", func(t *testing.T, dir string) string {
			sub := filepath.Join(dir, "sub")
			os.Mkdir(sub, 0o700)
			write(t, dir, "t", tok, 0o600)
			symlink(t, "../t", filepath.Join(sub, "join-token"))
			return filepath.Join(sub, "join-token")
		}, "only point within its own directory"},
		{"empty refused", func(t *testing.T, dir string) string { return write(t, dir, "t", "\n", 0o600) }, "empty"},
		{"two words refused", func(t *testing.T, dir string) string { return write(t, dir, "t", "bcjt_a bcjt_b", 0o600) }, "one word"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.setup(t, t.TempDir())
			done := make(chan struct{})
			var got string
			var err error
			go func() {
				defer close(done)
				got, err = ReadTokenFile(path)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("ReadTokenFile blocked")
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got == "" {
					t.Fatal("no token")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tok) {
				t.Errorf("the error repeats the token: %v", err)
			}
		})
	}
}

func write(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

func TestRemoveTokenFile(t *testing.T) {
	// The read-only mount is TestTokenFileOnReadOnlyMountWarns (as root).
	p := write(t, t.TempDir(), "t", "x", 0o600)
	if ro, err := RemoveTokenFile(p); err != nil || ro {
		t.Fatalf("RemoveTokenFile = %v, %v", ro, err)
	}
	if ro, err := RemoveTokenFile(p); err != nil || ro {
		t.Fatalf("RemoveTokenFile of a removed file = %v, %v", ro, err)
	}
}

func TestStdinToken(t *testing.T) {
	tok, from, err := TokenSource{Stdin: strings.NewReader("\n  bcjt_x \r\n")}.Read()
	if err != nil || tok != "bcjt_x" || from != "standard input" {
		t.Fatalf("Read = %q, %q, %v", tok, from, err)
	}
	_, _, err = TokenSource{Stdin: bytes.NewReader(bytes.Repeat([]byte("a"), MaxTokenSize+1))}.Read()
	if err == nil || !strings.Contains(err.Error(), "4096") {
		t.Fatalf("oversized stdin: %v", err)
	}
	if _, _, err = (TokenSource{}).Read(); err != ErrNoToken {
		t.Fatalf("no source: %v", err)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"bcjt_jt_01abc", " bcjt_x\n", "", "a b", "\x00", "bcjt_\u00e9", strings.Repeat("x", 5000)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseToken(data)
		if err != nil {
			if len(data) > 8 && strings.Contains(err.Error(), string(data)) {
				t.Fatalf("the error quotes the input: %v", err)
			}
			return
		}
		if tok == "" || len(tok) > MaxTokenSize || strings.ContainsAny(tok, " \t\r\n") {
			t.Fatalf("accepted %q", tok)
		}
		if again, err := ParseToken([]byte(tok)); err != nil || again != tok {
			t.Fatalf("not idempotent: %q -> %q, %v", tok, again, err)
		}
	})
}

func FuzzReadTokenFile(f *testing.F) {
	f.Add([]byte("bcjt_abc\n"), uint16(0o600))
	f.Add([]byte("bcjt_abc"), uint16(0o644))
	f.Add(bytes.Repeat([]byte("a"), 5000), uint16(0o400))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, mode uint16) {
		if len(data) > 3*MaxTokenSize {
			return
		}
		p := filepath.Join(dir, "t")
		os.Remove(p)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		m := os.FileMode(mode) & os.ModePerm
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
		tok, err := ReadTokenFile(p)
		if err == nil && (m != 0o600 && m != 0o400 || len(data) > MaxTokenSize || tok == "") {
			t.Fatalf("accepted mode %04o, %d bytes", m, len(data))
		}
	})
}
