package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/protocol"
)

func TestParseBLSEntry(t *testing.T) {
	e, err := parseBLSEntry("debian.conf", []byte(`# comment
title   Debian GNU/Linux 12
version 6.1.0-13-amd64
linux   /debian/vmlinuz
initrd  /debian/intel-ucode.img
initrd  /debian/initrd.img
options root=UUID=1234 ro
options	quiet
`))
	if err != nil {
		t.Fatal(err)
	}
	want := blsEntry{name: "debian.conf", title: "Debian GNU/Linux 12", version: "6.1.0-13-amd64", linux: "/debian/vmlinuz",
		initrd: []string{"/debian/intel-ucode.img", "/debian/initrd.img"}, options: "root=UUID=1234 ro quiet"}
	if diff := cmp.Diff(want, e, cmp.AllowUnexported(blsEntry{})); diff != "" {
		t.Error(diff)
	}
	for name, body := range map[string]string{
		"uki":      "efi /EFI/Linux/debian.efi\n",
		"no linux": "title x\n",
		"escape":   "linux /../../etc/shadow\n",
		"relative": "linux vmlinuz\n",
	} {
		if _, err := parseBLSEntry(name, []byte(body)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestPickBLS(t *testing.T) {
	entries := []blsEntry{
		{name: "debian-6.1.0-9.conf", version: "6.1.0-9", linux: "/a"},
		{name: "debian-6.1.0-13.conf", version: "6.1.0-13", linux: "/b"},
		{name: "debian-6.1.0-12-rt.conf", version: "6.1.0-12-rt", linux: "/c"},
	}
	for def, want := range map[string]string{
		"":                    "/b",
		"debian-6.1.0-9.conf": "/a",
		"debian-6.1.0-9":      "/a",
		"debian-*":            "/b",
		"no-such-entry":       "/b",
		"debian-6.1.0-12*":    "/c",
	} {
		if e, ok := pickBLS(entries, def); !ok || e.linux != want {
			t.Errorf("default %q: %s, want %s", def, e.linux, want)
		}
	}
	if _, ok := pickBLS(nil, ""); ok {
		t.Error("picked from nothing")
	}
}

func TestVersionLess(t *testing.T) {
	sorted := []string{"", "1", "1.2", "1.10", "2", "6.1.0-9", "6.1.0-13", "6.1.0-13-amd64", "6.10.0"}
	for i := range sorted {
		for j := range sorted {
			if got := versionLess(sorted[i], sorted[j]); got != (i < j) {
				t.Errorf("versionLess(%q, %q) = %v", sorted[i], sorted[j], got)
			}
		}
	}
}

func FuzzParseBLSEntry(f *testing.F) {
	f.Add([]byte("title x\nversion 1\nlinux /vmlinuz\ninitrd /a /b\noptions root=/dev/sda1\n"))
	f.Add([]byte("efi /x.efi\n"))
	f.Add([]byte("linux\t/v\x00\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := parseBLSEntry("f.conf", b)
		if err != nil {
			return
		}
		for _, p := range append([]string{e.linux}, e.initrd...) {
			if protocol.ValidDeployPath(p) != nil {
				t.Fatalf("accepted path %q", p)
			}
		}
		if strings.ContainsAny(e.options, "\n\r\x00") {
			t.Fatalf("options %q", e.options)
		}
	})
}

func FuzzVersionLess(f *testing.F) {
	f.Add("6.1.0-13", "6.1.0-9")
	f.Add("01", "1")
	f.Add("a1", "1a")
	f.Fuzz(func(t *testing.T, a, b string) {
		if versionLess(a, a) {
			t.Fatalf("%q < itself", a)
		}
		if versionLess(a, b) && versionLess(b, a) {
			t.Fatalf("%q and %q are each less than the other", a, b)
		}
	})
}

func TestParseLsP(t *testing.T) {
	out := []byte(`debugfs: ls -p "/"
/2/040755/0/0/.//
/2/040755/0/0/..//
/12/040755/0/0/etc//
/14/120777/0/0/vmlinuz/26/
debugfs: ls -p "/etc"
/12/040755/0/0/.//
/620/100600/0/0/join-token/7/
/9/100644/1000/1001/weird name/1/
`)
	got := parseLsP(out)
	want := map[string][]dirEntry{
		"/":    {{"etc", 0o40755, 0, 0}, {"vmlinuz", 0o120777, 0, 0}},
		"/etc": {{"join-token", 0o100600, 0, 0}, {"weird name", 0o100644, 1000, 1001}},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(dirEntry{})); diff != "" {
		t.Error(diff)
	}
}

func FuzzParseLsP(f *testing.F) {
	f.Add([]byte("debugfs: ls -p \"/\"\n/2/040755/0/0/.//\n/12/040755/0/0/etc//\n"))
	f.Add([]byte("/1/2/3/4/5/6/\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for dir, ents := range parseLsP(b) {
			for _, e := range ents {
				if e.name == "" || e.name == "." || e.name == ".." || strings.Contains(e.name, "/") {
					t.Fatalf("%s: entry %+v", dir, e)
				}
			}
		}
	})
}

func TestParseMdir(t *testing.T) {
	got := parseMdir([]byte("::/EFI/BOOT/\n::/EFI/grub.cfg\n::/EFI/BOOT/BOOTX64.EFI\nnoise\n"), "/EFI")
	want := map[string]entryKind{"boot": kindDir, "grub.cfg": kindFile}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	if got := parseMdir([]byte("::/EFI/\n::/loader/\n"), "/"); len(got) != 2 || got["efi"] != kindDir {
		t.Errorf("root: %v", got)
	}
}

func FuzzParseMdir(f *testing.F) {
	f.Add([]byte("::/EFI/BOOT/\n::/EFI/grub.cfg\n"), "/EFI")
	f.Fuzz(func(t *testing.T, b []byte, dir string) {
		for name := range parseMdir(b, dir) {
			if name == "" || strings.Contains(name, "/") {
				t.Fatalf("entry %q", name)
			}
		}
	})
}

func TestFileContentRedacted(t *testing.T) {
	f := File{Path: "/etc/bcd/join-token", Content: []byte(joinToken)}
	if s := fmt.Sprintf("%v %+v %#v %s %x", f, f, f, f.Content, f.Content); strings.Contains(s, joinToken) || strings.Contains(s, fmt.Sprintf("%x", joinToken)) {
		t.Errorf("printed: %s", s)
	}
}

// TestWriteSkippingZeros: what a zeroed target receives, run by run.
func TestWriteSkippingZeros(t *testing.T) {
	const kb = 1 << 10
	data := func(n int) []byte { return bytes.Repeat([]byte{7}, n) }
	zero := func(n int) []byte { return make([]byte, n) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name    string
		p       []byte
		written int64
	}{
		{"all zero", zero(4 * zeroBlock), 0},
		{"all data", data(4 * zeroBlock), 4 * zeroBlock},
		{"short gap kept", cat(data(zeroBlock), zero(minSkip-zeroBlock), data(zeroBlock)), minSkip + zeroBlock},
		{"long gap skipped", cat(data(zeroBlock), zero(minSkip), data(zeroBlock)), 2 * zeroBlock},
		{"leading and trailing zeros", cat(zero(zeroBlock), data(zeroBlock), zero(zeroBlock)), zeroBlock},
		{"ragged tail", cat(zero(minSkip), data(3*kb)), 3 * kb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(int64(len(tc.p)) + 4096); err != nil {
				t.Fatal(err)
			}
			tg := &target{path: path, direct: f, buffered: f, zeroed: true}
			n, err := tg.writeSkippingZeros(tc.p, 4096, make([]byte, zeroBlock))
			if err != nil || n != tc.written {
				t.Errorf("wrote %d bytes (%v), want %d", n, err, tc.written)
			}
			got, _ := os.ReadFile(path)
			if !bytes.Equal(got[4096:], tc.p) {
				t.Error("file differs from p")
			}
		})
	}
}
