package kmod

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// globRef is a plain recursive fnmatch for patterns of *, ? and literals, the
// reference Glob must agree with.
func globRef(p, s string) bool {
	if p == "" {
		return s == ""
	}
	switch p[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if globRef(p[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && globRef(p[1:], s[1:])
	}
	return s != "" && s[0] == p[0] && globRef(p[1:], s[1:])
}

func FuzzGlob(f *testing.F) {
	f.Add("pci:v00001AF4d*sv*sd*bc*sc*i*", "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00")
	f.Add("acpi*:PNP0C0[0-9A-F]:*", "acpi:PNP0C0A:")
	f.Add("a[!]b]*", "acd")
	f.Add(`\`, `\`)
	f.Fuzz(func(t *testing.T, p, s string) {
		if len(p) > 64 || len(s) > 128 {
			return // the reference is exponential
		}
		got := Glob(p, s)
		if !strings.ContainsAny(p, "[\\") && got != globRef(p, s) {
			t.Fatalf("Glob(%q, %q) = %v, the reference says %v", p, s, got, !got)
		}
	})
}

func FuzzLoadIndex(f *testing.F) {
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join("testdata/tree/lib/modules/6.1.0-test", name))
		return string(b)
	}
	f.Add(read("modules.dep"), read("modules.alias"), read("modules.softdep"), "ext4")
	f.Add("a.ko: b.ko\nb.ko: a.ko\n", "alias x a\n", "softdep a pre: b post: a\n", "a")
	f.Fuzz(func(t *testing.T, dep, alias, softdep, name string) {
		ix := newIndex("/lib/modules/test")
		if ix.parseDep(strings.NewReader(dep)) != nil || ix.parseAlias(strings.NewReader(alias)) != nil ||
			ix.parseSoftdep(strings.NewReader(softdep)) != nil {
			return
		}
		order := ix.Order([]string{name})
		seen := map[string]bool{}
		for _, m := range order {
			if seen[m] {
				t.Fatalf("%s twice in %v", m, order)
			}
			seen[m] = true
			if _, ok := ix.Path(m); !ok {
				t.Fatalf("%s in the order but not in the index", m)
			}
		}
		ix.Match(name)
	})
}
