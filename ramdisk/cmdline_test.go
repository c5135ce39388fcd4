package ramdisk

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/protocol"
)

func TestParseCmdline(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Arg
	}{
		{"", nil},
		{"   \n", nil},
		{"console=ttyS0,115200 quiet", []Arg{{"console", "ttyS0,115200", true}, {"quiet", "", false}}},
		{"a=b=c", []Arg{{"a", "b=c", true}}},
		{"a= b", []Arg{{"a", "", true}, {"b", "", false}}},
		{"\ta=1\n\nb=2\r\n", []Arg{{"a", "1", true}, {"b", "2", true}}},
		// Double quotes group; the kernel drops the quotes around a value.
		{`a="x y" b`, []Arg{{"a", "x y", true}, {"b", "", false}}},
		// A quote before the name groups the whole word and is dropped too.
		{`"a=x y" b`, []Arg{{"a", "x y", true}, {"b", "", false}}},
		{`"quiet loud"`, []Arg{{"quiet loud", "", false}}},
		// A quote in the middle of a value stays: the kernel strips only the ends.
		{`a=x"y z"`, []Arg{{"a", `x"y z"`, true}}},
		{`a=x"y`, []Arg{{"a", `x"y`, true}}},
		// No escapes: a backslash is an ordinary character.
		{`a=\"b`, []Arg{{"a", `\"b`, true}}},
		// An unterminated quote runs to the end.
		{`a="x y`, []Arg{{"a", "x y", true}}},
		{`a="`, []Arg{{"a", "", true}}},
		{`""`, []Arg{{"", "", false}}},
		// '=' first is no value separator (the kernel's equals==0 case).
		{"=x", []Arg{{"=x", "", false}}},
		{"=x=y", []Arg{{"=x", "y", true}}},
		// 0xa0 is a space to the kernel's ctype.
		{"a=1\xa0b=2", []Arg{{"a", "1", true}, {"b", "2", true}}},
		{"-- init=/bin/sh", []Arg{{"--", "", false}, {"init", "/bin/sh", true}}},
	} {
		got := ParseCmdline(tc.in)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseCmdline(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

const (
	pinA = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	pinB = "sha256/PiPoFgA5WUoziU9lZOGxNIu9egCI1CxKy3PurtWcAJ0="
	pinC = "sha256/ypeBEsobvcr6wjGzmiPcTaeG7/gUfE5yuYB3ha/uSLs="
)

const nonce = "Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_"

func goodCmdline() string {
	return strings.Join([]string{
		"BOOT_IMAGE=vmlinuz initrd=initrd console=ttyS0,115200",
		"bcd.gateway_url=https://gw.example.com:8443",
		"bcd.server_name=gw.example.com",
		"bcd.site=site_01k5w",
		"bcd.serving_ca_pin=" + pinA,
		"bcd.join_signing_pin=" + pinB,
		"bcd.join_encryption_pin=" + pinC,
		"bcd.boot_nonce=" + nonce,
		"bcd.proxy=http://10.20.0.2:3128",
		"bcd.witness=http://10.20.0.2:8080/v1/witness",
	}, " ") + "\n"
}

func TestParseParams(t *testing.T) {
	p, err := ParseParams(goodCmdline(), false)
	if err != nil {
		t.Fatal(err)
	}
	if p.GatewayURL != "https://gw.example.com:8443" || p.ServerName != "gw.example.com" || p.Site != "site_01k5w" ||
		p.Pins.ServingCA != pinA || p.Pins.JoinSigning != pinB || p.Pins.JoinEncryption != pinC ||
		p.BootNonce != nonce || p.Proxy == nil || p.Proxy.String() != "http://10.20.0.2:3128" || p.LogLevel != slog.LevelInfo ||
		p.Witness == nil || p.Witness.String() != "http://10.20.0.2:8080/v1/witness" {
		t.Fatalf("params: %+v", p)
	}

	// The last occurrence wins, and - reads as _ in names, as for the kernel.
	p, err = ParseParams("bcd.site=operator bcd.log=debug "+goodCmdline()+" bcd.log=warn bcd.server-name=other.example.com", false)
	if err != nil {
		t.Fatal(err)
	}
	if p.Site != "site_01k5w" || p.LogLevel != slog.LevelWarn || p.ServerName != "other.example.com" {
		t.Fatalf("site %q, level %v, server name %q", p.Site, p.LogLevel, p.ServerName)
	}
	// No proxy is direct.
	p, err = ParseParams(strings.Replace(goodCmdline(), "bcd.proxy=http://10.20.0.2:3128", "", 1), false)
	if err != nil || p.Proxy != nil {
		t.Fatalf("proxy %v, err %v", p.Proxy, err)
	}
	// Quoted values are unquoted.
	p, err = ParseParams(strings.Replace(goodCmdline(), "bcd.site=site_01k5w", `bcd.site="site_01k5w"`, 1), false)
	if err != nil || p.Site != "site_01k5w" {
		t.Fatalf("site %q, err %v", p.Site, err)
	}
	// The nonce never appears in what is logged.
	if v := p.LogValue().String(); strings.Contains(v, nonce) {
		t.Fatalf("LogValue shows the nonce: %s", v)
	}
}

func TestParseParamsRefusals(t *testing.T) {
	replace := func(old, new string) string { return strings.Replace(goodCmdline(), old, new, 1) }
	drop := func(name string) string {
		var out []string
		for _, w := range strings.Fields(goodCmdline()) {
			if !strings.HasPrefix(w, name+"=") {
				out = append(out, w)
			}
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		cmdline   string
		allowHTTP bool
		name      string
		problem   string
	}{
		{drop(protocol.CmdlineGatewayURL), false, protocol.CmdlineGatewayURL, "is missing"},
		{drop(protocol.CmdlineServerName), false, protocol.CmdlineServerName, "is missing"},
		{drop(protocol.CmdlineSite), false, protocol.CmdlineSite, "is missing"},
		{drop(protocol.CmdlineServingCAPin), false, protocol.CmdlineServingCAPin, "is missing"},
		{drop(protocol.CmdlineJoinSigningPin), false, protocol.CmdlineJoinSigningPin, "is missing"},
		{drop(protocol.CmdlineJoinEncryptionPin), false, protocol.CmdlineJoinEncryptionPin, "is missing"},
		{drop(protocol.CmdlineBootNonce), false, protocol.CmdlineBootNonce, "is missing"},
		{replace("bcd.site=site_01k5w", "bcd.site"), false, protocol.CmdlineSite, "is empty"},
		{replace("bcd.site=site_01k5w", "bcd.site="), false, protocol.CmdlineSite, "is empty"},
		{replace("https://gw.example.com:8443", "http://gw.example.com:8443"), false, protocol.CmdlineGatewayURL, "must be https://"},
		{replace("https://gw.example.com:8443", "ftp://gw.example.com"), true, protocol.CmdlineGatewayURL, "must be an https:// URL"},
		{replace("https://gw.example.com:8443", "https://u:p@gw.example.com"), false, protocol.CmdlineGatewayURL, "user name"},
		{replace("https://gw.example.com:8443", "https://gw.example.com/?x=1"), false, protocol.CmdlineGatewayURL, "query"},
		{replace("https://gw.example.com:8443", "https://"), false, protocol.CmdlineGatewayURL, "no host"},
		{replace("bcd.server_name=gw.example.com", "bcd.server_name=gw_example!"), false, protocol.CmdlineServerName, "DNS name"},
		{replace(pinA, "sha256/abc"), false, protocol.CmdlineServingCAPin, "is not a pin"},
		{replace(pinB, "sha1/"+pinB[7:]), false, protocol.CmdlineJoinSigningPin, "is not a pin"},
		{replace(pinC, pinC[:20]), false, protocol.CmdlineJoinEncryptionPin, "is not a pin"},
		{replace(nonce, "short"), false, protocol.CmdlineBootNonce, "is not a boot nonce"},
		{replace(nonce, nonce+`\x`), false, protocol.CmdlineBootNonce, "is not a boot nonce"},
		{replace(nonce, strings.Repeat("a", 257)), false, protocol.CmdlineBootNonce, "is not a boot nonce"},
		{replace("http://10.20.0.2:3128", "https://10.20.0.2:3128"), false, protocol.CmdlineProxy, "is not an HTTP proxy"},
		{replace("http://10.20.0.2:8080/v1/witness", "ftp://10.20.0.2/v1/witness"), false, protocol.CmdlineWitness, "is not an http:// or https:// URL"},
		{replace("http://10.20.0.2:8080/v1/witness", "http://u:p@10.20.0.2/v1/witness"), false, protocol.CmdlineWitness, "is not an http:// or https:// URL"},
		{replace("http://10.20.0.2:3128", "http://10.20.0.2"), false, protocol.CmdlineProxy, "no port"},
		{replace("http://10.20.0.2:3128", "http://10.20.0.2:3128/path"), false, protocol.CmdlineProxy, "no path"},
		{replace("http://10.20.0.2:3128", "http://u:p@10.20.0.2:3128"), false, protocol.CmdlineProxy, "user name"},
		{replace("http://10.20.0.2:3128", "http://10.20.0.2:99999"), false, protocol.CmdlineProxy, "not a port"},
		{goodCmdline() + " bcd.log=verbose", false, protocol.CmdlineLog, "is not a log level"},
	} {
		_, err := ParseParams(tc.cmdline, tc.allowHTTP)
		var ce *CmdlineError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want a CmdlineError", tc.name, err)
			continue
		}
		if len(ce.Params) != 1 || ce.Params[0].Name != tc.name || !strings.Contains(ce.Params[0].Problem, tc.problem) {
			t.Errorf("%s: %v, want one error naming it with %q", tc.name, err, tc.problem)
		}
		if !strings.HasPrefix(err.Error(), "kernel parameter "+tc.name+" ") {
			t.Errorf("%s: message %q does not start by naming it", tc.name, err)
		}
		if strings.Contains(err.Error(), nonce) {
			t.Errorf("%s: the error repeats the nonce: %v", tc.name, err)
		}
	}

	// http:// only in a development build.
	if _, err := ParseParams(replace("https://gw.example.com:8443", "http://127.0.0.1:8080"), true); err != nil {
		t.Fatalf("allowHTTP: %v", err)
	}
	// Everything wrong at once is listed in the order of Required.
	_, err := ParseParams("console=ttyS0", false)
	var ce *CmdlineError
	if !errors.As(err, &ce) || len(ce.Params) != len(Required) {
		t.Fatalf("empty command line: %v", err)
	}
	for i, p := range ce.Params {
		if p.Name != Required[i] {
			t.Errorf("error %d names %s, want %s", i, p.Name, Required[i])
		}
	}
}

func TestReadParams(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cmdline")
	if err := os.WriteFile(path, []byte(goodCmdline()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadParams(path, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadParams(filepath.Join(dir, "missing"), false); err == nil || IsCmdlineError(err) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte(strings.Repeat("x ", MaxCmdline)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadParams(path, false); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("huge file: %v", err)
	}
}
