package ramdisk

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func FuzzParseCmdline(f *testing.F) {
	for _, s := range []string{
		"", "quiet", "a=b", `a="b c"`, `"a=b c"`, `a=x"y z"`, `a="`, `""`, "=x=y", "a\xa0b",
		"console=ttyS0,115200 initrd=initrd bcd.site=x -- init=/bin/sh",
		goodCmdline(),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := ParseCmdline(s)
		total := 0
		for _, a := range args {
			total += len(a.Name) + len(a.Value)
			if !a.HasValue && a.Value != "" {
				t.Fatalf("%q: a value without HasValue: %+v", s, a)
			}
		}
		if total > len(s) {
			t.Fatalf("%q: the args hold %d bytes, more than the input's %d", s, total, len(s))
		}
		if i := strings.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		if strings.ContainsRune(s, '"') {
			return
		}
		// Without quotes the kernel's rule is plain: words split at spaces, the
		// value after the first '=' that is not the word's first byte.
		var want []Arg
		for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r < 0x100 && isSpace(byte(r)) }) {
			want = append(want, wordArg(w))
		}
		// FieldsFunc works on runes; the kernel on bytes. Compare only when the
		// input is plain ASCII, where both agree.
		for i := 0; i < len(s); i++ {
			if s[i] >= 0x80 {
				return
			}
		}
		if diff := cmp.Diff(want, args); diff != "" {
			t.Fatalf("%q (-want +got):\n%s", s, diff)
		}
		// Rendering the args back gives the same args.
		var words []string
		for _, a := range args {
			w := a.Name
			if a.HasValue {
				w += "=" + a.Value
			}
			words = append(words, w)
		}
		if diff := cmp.Diff(args, ParseCmdline(strings.Join(words, " "))); diff != "" {
			t.Fatalf("%q: not stable when rendered back (-first +second):\n%s", s, diff)
		}
	})
}

func wordArg(w string) Arg {
	if i := strings.IndexByte(w[1:], '='); len(w) > 1 && i >= 0 {
		return Arg{Name: w[:i+1], Value: w[i+2:], HasValue: true}
	}
	return Arg{Name: w}
}

func FuzzParseParams(f *testing.F) {
	f.Add(goodCmdline(), false)
	f.Add(strings.Replace(goodCmdline(), "https://", "http://", 1), true)
	f.Add("bcd.gateway_url=https://x bcd.log=debug", false)
	f.Add(`bcd.site="a b" bcd.proxy=http://[::1]:3128`, false)
	f.Add(`bcd.witness=http://10.20.0.2:8080/v1/w%41tness?x#y`, false)
	f.Fuzz(func(t *testing.T, s string, allowHTTP bool) {
		p, err := ParseParams(s, allowHTTP)
		if err != nil {
			if !IsCmdlineError(err) {
				t.Fatalf("%q: %v is not a CmdlineError", s, err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("%q: a message over several lines: %q", s, err)
			}
			return
		}
		// What was accepted survives being rendered onto a command line again.
		words := []string{
			"bcd.gateway_url=" + p.GatewayURL,
			"bcd.server_name=" + p.ServerName,
			"bcd.site=" + p.Site,
			"bcd.serving_ca_pin=" + p.Pins.ServingCA,
			"bcd.join_signing_pin=" + p.Pins.JoinSigning,
			"bcd.join_encryption_pin=" + p.Pins.JoinEncryption,
			"bcd.boot_nonce=" + p.BootNonce,
		}
		if p.Proxy != nil {
			words = append(words, "bcd.proxy="+p.Proxy.String())
		}
		if p.Witness != nil {
			words = append(words, "bcd.witness="+p.Witness.String())
		}
		again, err := ParseParams(strings.Join(words, " "), allowHTTP)
		if err != nil {
			t.Fatalf("%q: accepted params do not parse again: %v", s, err)
		}
		again.LogLevel = p.LogLevel
		if diff := cmp.Diff(p.LogValue().String(), again.LogValue().String()); diff != "" {
			t.Fatalf("%q: params changed when rendered again:\n%s", s, diff)
		}
	})
}
