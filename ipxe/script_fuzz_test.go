package ipxe

import (
	"strings"
	"testing"
)

// FuzzRamdiskScript: whatever the operator's command line, the site name or the
// nonce hold, a script that renders has exactly the template's lines, no iPXE
// expansion, and each value intact on the kernel line.
func FuzzRamdiskScript(f *testing.F) {
	f.Add("console=ttyS0,115200 quiet", "site_01k5w", "q1w2e3r4")
	f.Add("a || b", "fsn1", "n")
	f.Add("x=${net0/mac}", "s", "n")
	f.Add("init=\"/bin/sh\"", "s\nboot", "n#")
	f.Add("\t", " ", "")
	lines := strings.Count(func() string {
		var b strings.Builder
		if err := testRamdisk().Render(&b); err != nil {
			f.Fatal(err)
		}
		return b.String()
	}(), "\n")
	f.Fuzz(func(t *testing.T, cmdline, site, nonce string) {
		rd := testRamdisk()
		rd.Cmdline, rd.Params.Site, rd.Nonce = cmdline, site, nonce
		var b strings.Builder
		if err := rd.Render(&b); err != nil {
			if b.Len() != 0 {
				t.Fatal("a failed render wrote output")
			}
			return
		}
		s := b.String()
		if n := strings.Count(s, "\n"); n != lines {
			t.Fatalf("%d lines, want %d:\n%s", n, lines, s)
		}
		if strings.ContainsAny(s, "$\"'\\`") {
			t.Fatalf("script holds a character iPXE or the kernel would interpret:\n%s", s)
		}
		kernel := strings.Split(s, "\n")[2]
		words := strings.Fields(kernel)
		if words[0] != "kernel" || words[len(words)-3] != "||" {
			t.Fatalf("kernel line %q", kernel)
		}
		for _, w := range append(strings.Fields(cmdline), "bcd.site="+site, "bcd.boot_nonce="+nonce) {
			found := false
			for _, k := range words[2 : len(words)-3] {
				if k == w {
					found = true
				}
			}
			if !found {
				t.Fatalf("%q missing from the kernel line %q", w, kernel)
			}
		}
	})
}
