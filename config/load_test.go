package config

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func write(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	p := write(t, siteDoc, 0o600)
	c, err := Load(p, ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Site != "fsn1" || c.Boot == nil || !c.Boot.ProxyDHCP {
		t.Errorf("%+v", c)
	}

	p = write(t, "site = 1\n", 0o600)
	_, err = Load(p, ParseOptions{})
	var e *Error
	if !errors.As(err, &e) || e.File != p || e.Line != 1 {
		t.Fatalf("got %v", err)
	}
	if want := p + ":1: site must be a string, not an integer"; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
}

func TestLoadTooLarge(t *testing.T) {
	// Valid TOML, so only the size can refuse it.
	p := write(t, strings.Repeat("# padding\n", MaxSize/10+1), 0o600)
	_, err := Load(p, ParseOptions{})
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 1 || !strings.Contains(err.Error(), "larger than 65536 bytes") {
		t.Fatalf("got %v", err)
	}
	if list[0].File != p || list[0].Line != 0 {
		t.Errorf("%+v", list[0])
	}
	// Exactly MaxSize is fine.
	p = write(t, strings.Repeat("#", MaxSize-1)+"\n", 0o600)
	if _, err := Load(p, ParseOptions{}); err != nil {
		t.Errorf("%d bytes: %v", MaxSize, err)
	}
}

// TestLoadRefusesWhatIsNotAFile: a FIFO (which a plain open waits on for a
// writer, forever), a directory or a device (/dev/zero never ends) is refused
// before a byte is read, naming the path and what it is.
func TestLoadRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, what := range map[string]string{fifo: "a FIFO", dir: "a directory", "/dev/zero": "a device"} {
		_, err := Load(path, ParseOptions{})
		if want := path + ": not a regular file (" + what + ")"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%s) = %v, want %q", path, err, want)
		}
		if IsInvalid(err) {
			t.Errorf("Load(%s): a file that cannot be read is not an invalid one", path)
		}
	}
}

func TestLoadMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(p, ParseOptions{})
	if err == nil || !strings.Contains(err.Error(), p) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v", err)
	}
	if IsInvalid(err) {
		t.Error("a missing file is not an invalid one")
	}
}

func TestCheck(t *testing.T) {
	var out bytes.Buffer
	if !Check(write(t, nodeDoc, 0o600), ParseOptions{}, &out) || out.String() != "OK\n" {
		t.Errorf("valid: %q", out.String())
	}

	p := write(t, "site = \"x\"\nsite = \"y\"\n[boot]\nproxy_dhcp = true\n", 0o600)
	out.Reset()
	if Check(p, ParseOptions{}, &out) {
		t.Error("Check passed a bad file")
	}
	want := p + ":2: duplicate key \"site\" (first on line 1)\n" +
		p + ":4: [boot] proxy_dhcp needs server_ip and url (missing server_ip and url)\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}

	missing := filepath.Join(t.TempDir(), "none.toml")
	out.Reset()
	if Check(missing, ParseOptions{}, &out) || !strings.Contains(out.String(), missing) {
		t.Errorf("missing: %q", out.String())
	}
}

func TestPermissions(t *testing.T) {
	for _, tc := range []struct {
		mode               os.FileMode
		readable, writable bool
		text               string
	}{
		{0o600, false, false, ""},
		{0o400, false, false, ""},
		{0o644, true, false, "readable by group, readable by others"},
		{0o640, true, false, "readable by group"},
		{0o620, false, true, "writable by group"},
		{0o602, false, true, "writable by others"},
		{0o604, true, false, "readable by others"},
		{0o666, true, true, "readable by group, writable by group, readable by others, writable by others"},
	} {
		p := write(t, nodeDoc, tc.mode)
		r, err := Permissions(p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Mode != tc.mode || r.Readable != tc.readable || r.Writable != tc.writable || r.OK() != (tc.text == "") {
			t.Errorf("%04o: %+v", tc.mode, r)
		}
		if r.UID != uint32(os.Getuid()) {
			t.Errorf("%04o: uid %d, want %d", tc.mode, r.UID, os.Getuid())
		}
		if !strings.HasSuffix(r.String(), tc.text) {
			t.Errorf("%04o: %q", tc.mode, r.String())
		}
	}
	if _, err := Permissions(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Error("no error for a missing file")
	}
}
