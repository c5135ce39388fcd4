package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFormatRoundTrip(t *testing.T) {
	for _, tc := range docs {
		if tc.msg != "" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			out := Format(c)
			back, err := Parse(out, tc.opts)
			if err != nil {
				t.Fatalf("%v in\n%s", err, out)
			}
			if diff := cmp.Diff(c, back); diff != "" {
				t.Errorf("(-parsed +reparsed):\n%s\n%s", diff, out)
			}
		})
	}
}

func TestFormatStrings(t *testing.T) {
	c := &Config{
		Site: `a "quoted" \back\slash\ zürich ☃ 😀 '`,
		Boot: &Boot{Cmdline: `console=ttyS0 root="LABEL=x y" \\ # not a comment`},
	}
	out := Format(c)
	back, err := Parse(out, ParseOptions{})
	if err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	if back.Site != c.Site || back.Boot.Cmdline != c.Boot.Cmdline {
		t.Errorf("got %q, %q from\n%s", back.Site, back.Boot.Cmdline, out)
	}
	// Only defaults were left out.
	want := "site = \"a \\\"quoted\\\" \\\\back\\\\slash\\\\ zürich ☃ 😀 '\"\n\n[boot]\n" +
		"cmdline = \"console=ttyS0 root=\\\"LABEL=x y\\\" \\\\\\\\ # not a comment\"\n"
	if string(out) != want {
		t.Errorf("Format:\n%s\nwant:\n%s", out, want)
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"":               `""`,
		"plain":          `"plain"`,
		`"`:              `"\""`,
		`\`:              `"\\"`,
		"\b\t\n\f\r":     `"\b\t\n\f\r"`,
		"\x00\x1b\x7f":   `"\u0000\u001B\u007F"`,
		"\u0085\u009f":   `"\u0085\u009F"`,
		"é😀\u2028\uFEFF": "\"é😀\u2028\uFEFF\"",
		"bad\xffbyte":    "\"bad\uFFFDbyte\"",
	} {
		got := quote(in)
		if got != want {
			t.Errorf("quote(%q) = %s, want %s", in, got, want)
		}
		doc, errs := parseDocument([]byte("k = " + got))
		if len(errs) > 0 {
			t.Errorf("%s: %v", got, errs)
			continue
		}
		if v := doc.tables[0].keys[0].val; v != strings.ToValidUTF8(in, "\uFFFD") {
			t.Errorf("%s reads back as %q", got, v)
		}
	}
}

func TestFormatOmitsDefaults(t *testing.T) {
	c, err := Parse([]byte(nodeDoc+"data_dir = \"/var/lib/bcd\"\n[plugins]\npids_max = 128\n[journal]\npath = \"/var/lib/bcd/journal.db\"\n"), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(nodeDoc, "# written by install-bcd.sh\n") + "\n[plugins]\n\n[journal]\n"
	if got := string(Format(c)); got != want {
		t.Errorf("Format:\n%s\nwant:\n%s", got, want)
	}
}
