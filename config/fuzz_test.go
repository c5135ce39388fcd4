package config

import (
	"testing"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// asMap is the document as a generic TOML decoder gives it.
func (d *document) asMap() map[string]any {
	m := map[string]any{}
	for i, t := range d.tables {
		dst := m
		if i > 0 {
			dst = map[string]any{}
			m[t.name] = dst
		}
		for _, e := range t.keys {
			dst[e.key] = e.val
		}
	}
	return m
}

// sameAsTOML fails t when the subset reads data and a full TOML parser
// does not, or reads other values. The check is on the syntax layer, whose
// keys mean nothing yet, so the fuzzer need not guess key names.
func sameAsTOML(t *testing.T, data []byte) bool {
	t.Helper()
	doc, errs := parseDocument(data)
	if len(errs) > 0 {
		return false
	}
	var want map[string]any
	if _, err := toml.Decode(string(data), &want); err != nil {
		t.Fatalf("the subset reads %q, TOML refuses it: %v", data, err)
	}
	if diff := cmp.Diff(want, doc.asMap(), cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("%q: the subset disagrees with TOML (-toml +subset):\n%s", data, diff)
	}
	return true
}

// syntaxDocs are TOML documents in the subset whose keys mean nothing to
// bcd: the syntax layer must read each of them as TOML does.
var syntaxDocs = []string{
	"1 = 1\n- = -1\n_ = +1\ntrue = false\ninf = 0\n1979-05-27 = 2\nA-b_C = 3\n",
	"a = 1 # c\n[a-b] # c\n[ c ]\n[\td\t]#c\n",
	"a = ''\nb = \"\"\nc = \"#\"\nd = '#'\ne = \"'\"\nf = '\"'\ng = '\\'\n",
	"a=1\nb=true\nc=\"x\"#\n",
	"a = true # \"quotes\" 'ticks' [brackets] {braces} = \\ \t tab\n",
	"\uFEFF[a]\nb = 1\n",
	"\uFEFF",
	"a = -9223372036854775808\nb = 9_223_372_036_854_775_807\nc = -0\nd = +0\ne = 1_2_3\n",
	"a = \"\\u0000\\u001f\\u007F\\U0010FFFF\\uE000\\uFFFF\"\n",
	"a = \"tab\there\"\nb = 'tab\there'\n",
	"a = 1\r\n\r\n[b]\r\nc = 2",
	"[a]\n[b]\n[c]\nx = 1\n",
	"a = \"zürich ☃ \U0001F600 \u2028\"\n# ünïcode ☃ \uFEFF\n",
}

func TestSameAsTOML(t *testing.T) {
	for _, doc := range syntaxDocs {
		if !sameAsTOML(t, []byte(doc)) {
			t.Errorf("the syntax layer refuses %q", doc)
		}
	}
	n := 0
	for _, tc := range docs {
		if len(tc.doc) > MaxSize {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			if sameAsTOML(t, []byte(tc.doc)) {
				n++
			} else if tc.msg == "" {
				t.Error("a valid document fails the syntax layer")
			}
		})
	}
	if n < 30 {
		t.Errorf("only %d documents reached the comparison", n)
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range docs {
		if len(tc.doc) <= MaxSize { // a large seed only slows the mutator
			f.Add([]byte(tc.doc))
		}
	}
	for _, doc := range syntaxDocs {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsTOML(t, data)
		for _, opts := range []ParseOptions{{}, {AllowHTTP: true}} {
			c, err := Parse(data, opts)
			if err != nil {
				if c != nil {
					t.Fatal("a config came with errors")
				}
				list, ok := err.(ErrorList)
				if !ok || len(list) == 0 {
					t.Fatalf("error %T %v is not an ErrorList", err, err)
				}
				continue
			}
			out := Format(c)
			back, err := Parse(out, opts)
			if err != nil {
				t.Fatalf("Format gave %q, which does not parse: %v", out, err)
			}
			if diff := cmp.Diff(c, back); diff != "" {
				t.Fatalf("Format does not round-trip %q (-parsed +reparsed):\n%s", data, diff)
			}
		}
		if utf8.Valid(data) {
			s := string(data)
			doc, errs := parseDocument([]byte("k = " + quote(s)))
			if len(errs) > 0 {
				t.Fatalf("quote(%q) = %s does not parse: %v", s, quote(s), errs)
			}
			if got := doc.tables[0].keys[0].val; got != s {
				t.Fatalf("quote(%q) reads back as %q", s, got)
			}
			sameAsTOML(t, []byte("k = "+quote(s)))
		}
	})
}
