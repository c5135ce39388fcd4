package pins

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
)

func TestParse(t *testing.T) {
	a := sha256.Sum256([]byte("a"))
	b := sha256.Sum256([]byte("b"))
	file := "# pinned by the install script\n" + Format("bcx-ipmi", a) + "\n" +
		strings.ToUpper(Format("other_1.2", b)[:64]) + " *other_1.2\n"
	p, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if pin, ok := p.Lookup("bcx-ipmi"); !ok || pin.SHA256 != a || pin.Line != 2 {
		t.Errorf("bcx-ipmi: %+v %v", pin, ok)
	}
	if pin, ok := p.Lookup("other_1.2"); !ok || pin.SHA256 != b {
		t.Errorf("other_1.2: %+v %v", pin, ok)
	}
	if _, ok := p.Lookup("missing"); ok {
		t.Error("found a plugin that is not pinned")
	}
}

func TestParseRefuses(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, c := range []struct{ file, want string }{
		{h + " bcx-ipmi\n", "line 1: want two spaces"},
		{h + "\tbcx-ipmi\n", "line 1: want two spaces"},
		{h[:62] + "  bcx-ipmi\n", "line 1: the digest is not 64 hex"},
		{strings.Repeat("zz", 32) + "  bcx-ipmi\n", "line 1: the digest is not 64 hex"},
		{h + "  ../bcx-ipmi\n", "is not a plugin name"},
		{h + "  /usr/bin/sh\n", "is not a plugin name"},
		{h + "  bcx ipmi\n", "is not a plugin name"},
		{h + "  pins\n", "is not a plugin name"},
		{h + "  ..\n", "is not a plugin name"},
		{h + "  \\bcx-ipmi\n", "is not a plugin name"},
		{h + "  bcx-ipmi\r\n", "line 1: carriage return"},
		{"\n" + h + "  bcx-ipmi\n" + h + "  bcx-ipmi\n", "line 3: bcx-ipmi is already pinned on line 2"},
		{"short\n", "line 1: want"},
		{strings.Repeat("#", MaxSize+1), "larger than"},
	} {
		_, err := Parse([]byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", c.file, err, c.want)
		}
	}
}

// TestSha256sumWritesWhatParseReads: the install script writes the pins file with
// sha256sum, so the real tool is the reference.
func TestSha256sumWritesWhatParseReads(t *testing.T) {
	tool := testenv.NeedTool(t, "sha256sum")
	dir := t.TempDir()
	content := []byte("plugin binary")
	if err := os.WriteFile(filepath.Join(dir, "bcx-ipmi"), content, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tool, "bcx-ipmi")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(out)
	if err != nil {
		t.Fatalf("Parse(%q): %v", out, err)
	}
	if pin, ok := p.Lookup("bcx-ipmi"); !ok || pin.SHA256 != sha256.Sum256(content) {
		t.Errorf("sha256sum line %q parsed to %+v", out, p)
	}
	if Format("bcx-ipmi", sha256.Sum256(content)) != string(out) {
		t.Errorf("Format differs from sha256sum: %q vs %q", Format("bcx-ipmi", sha256.Sum256(content)), out)
	}
}

func FuzzParse(f *testing.F) {
	h := strings.Repeat("0f", 32)
	for _, s := range []string{
		"", "\n", "# c\n", h + "  bcx-ipmi\n", h + " *bcx-ipmi", h + "  a\n" + h + "  a\n",
		h + "  ../x\n", h[:63] + "  x\n", h + "  x\r\n", h + "\x00 x",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if p != nil {
				t.Fatal("pins returned with an error")
			}
			return
		}
		// Whatever parses names only plugins a path cannot escape with, and
		// re-renders to something that parses to the same pins.
		var b strings.Builder
		for name, pin := range p {
			if !ValidName(name) || strings.ContainsAny(name, "/\\") {
				t.Fatalf("accepted name %q", name)
			}
			b.WriteString(Format(name, pin.SHA256))
		}
		q, err := Parse([]byte(b.String()))
		if err != nil || len(q) != len(p) {
			t.Fatalf("re-rendered pins do not parse: %v", err)
		}
		for name, pin := range p {
			if q[name].SHA256 != pin.SHA256 {
				t.Fatalf("%s changed digest", name)
			}
		}
	})
}
