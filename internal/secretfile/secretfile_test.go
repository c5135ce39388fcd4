package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, dir string) string
		opt     Options
		wantErr error  // nil for success
		wantMsg string // part of the message
	}{
		{"0600 private ok", file("k", "secret", 0o600), Options{Limit: 6, Private: true}, nil, ""},
		{"0644 public ok", file("k", "x", 0o644), Options{Limit: 6}, nil, ""},
		{"0644 private refused", file("k", "x", 0o644), Options{Limit: 6, Private: true, What: "the node key"}, ErrMode, "mode 0644 lets group or others access the node key; it must be 0600 (chmod 600 "},
		{"0640 private refused", file("k", "x", 0o640), Options{Limit: 6, Private: true}, ErrMode, "mode 0640"},
		{"over the limit", file("k", "secret!", 0o600), Options{Limit: 6}, ErrTooLarge, "larger than 6 bytes"},
		{"directory", func(t *testing.T, dir string) string { return dir }, Options{Limit: 6}, ErrNotRegular, "not a regular file (a directory)"},
		{"FIFO does not block", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "fifo")
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, Options{Limit: 6}, ErrNotRegular, "not a regular file (a FIFO)"},
		{"symlink followed", link(), Options{Limit: 6}, nil, ""},
		{"symlink refused with NoFollow", link(), Options{Limit: 6, NoFollow: true}, syscall.ELOOP, ""},
		{"missing", func(t *testing.T, dir string) string { return filepath.Join(dir, "none") }, Options{Limit: 6}, os.ErrNotExist, ""},
		{"own check", file("k", "x", 0o600), Options{Limit: 6, Check: func(os.FileInfo) error { return errCustom }}, errCustom, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.setup(t, t.TempDir())
			data, err := Read(path, tc.opt)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				if len(data) == 0 {
					t.Error("read nothing")
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Read = %v, want %v containing %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

var errCustom = errors.New("custom")

func file(name, content string, mode os.FileMode) func(t *testing.T, dir string) string {
	return func(t *testing.T, dir string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
}

func link() func(t *testing.T, dir string) string {
	return func(t *testing.T, dir string) string {
		target := file("target", "x", 0o600)(t, dir)
		p := filepath.Join(dir, "link")
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestCheckDir: a directory group or others can write in is refused with its
// path and mode (sticky and setgid included), a file is not a directory, and a
// missing path is fs.ErrNotExist for the caller to create.
func TestCheckDir(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		// Chmod: Mkdir's mode is narrowed by the umask.
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		path    string
		wantErr error
		wantMsg string
	}{
		{mk("private", 0o700), nil, ""},
		{mk("readable", 0o755), nil, ""},
		{mk("open", 0o777), ErrDirMode, "open: mode 0777 lets group or others write in it"},
		{mk("group", 0o770), ErrDirMode, "mode 0770"},
		{mk("tmp", 0o777|os.ModeSticky), ErrDirMode, "mode 1777"},
		{mk("setgid", 0o775|os.ModeSetgid), ErrDirMode, "mode 2775"},
		{file("f", "x", 0o600)(t, base), ErrNotDir, "f: not a directory (a regular file)"},
		{filepath.Join(base, "none"), os.ErrNotExist, ""},
	} {
		err := CheckDir(tc.path)
		if tc.wantErr == nil {
			if err != nil {
				t.Errorf("CheckDir(%s): %v", tc.path, err)
			}
			continue
		}
		if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) || (tc.wantMsg != "" && !strings.Contains(err.Error(), tc.path)) {
			t.Errorf("CheckDir(%s) = %v, want %v with %q", tc.path, err, tc.wantErr, tc.wantMsg)
		}
	}
}
