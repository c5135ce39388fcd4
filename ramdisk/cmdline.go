package ramdisk

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"strings"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// DefaultCmdlinePath is where the kernel publishes its command line.
const DefaultCmdlinePath = "/proc/cmdline"

// MaxCmdline bounds what is read of a command line file: the kernel keeps at most a
// few KiB (2048 bytes on x86), so anything longer is not a kernel command line.
const MaxCmdline = 64 << 10

// Arg is one word of a kernel command line: a parameter and, after its first '=',
// a value. HasValue tells "foo" from "foo=".
type Arg struct {
	Name, Value string
	HasValue    bool
}

// ParseCmdline splits a kernel command line the way the kernel's next_arg does:
// whitespace separates words, a double quote starts or ends a part where whitespace
// does not separate, and there are no escapes. Quotes are dropped at the start of
// the word, at the start of the value and at the end of the word; a quote anywhere
// else stays in the value, as the kernel leaves it. A NUL byte ends the line, as it
// ends the kernel's C string.
func ParseCmdline(s string) []Arg {
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	var args []Arg
	b := []byte(s)
	i := skipSpaces(b, 0)
	for i < len(b) {
		var a Arg
		a, i = nextArg(b, i)
		args = append(args, a)
		i = skipSpaces(b, i)
	}
	return args
}

// isSpace is the kernel's isspace: its ctype table also counts 0xa0 (no-break
// space in Latin-1) as a space.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || c == 0xa0
}

func skipSpaces(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// nextArg mirrors lib/cmdline.c's next_arg on b[start:], cutting strings where the
// C code writes NUL bytes.
func nextArg(b []byte, start int) (Arg, int) {
	inQuote, quoted := false, false
	if b[start] == '"' {
		start++
		inQuote, quoted = true, true
	}
	w := b[start:]
	i, equals := 0, 0
	for ; i < len(w); i++ {
		if isSpace(w[i]) && !inQuote {
			break
		}
		if equals == 0 && w[i] == '=' {
			equals = i
		}
		if w[i] == '"' {
			inQuote = !inQuote
		}
	}
	end := start + i
	if end < len(b) {
		end++ // the separating space
	}
	// A private copy where the kernel's NUL bytes can be written.
	word := append([]byte(nil), w[:i]...)
	var a Arg
	valStart := -1
	if equals != 0 {
		word[equals] = 0
		valStart = equals + 1
		a.HasValue = true
		if valStart < len(word) && word[valStart] == '"' {
			valStart++
			if i > 0 && word[i-1] == '"' {
				word[i-1] = 0
			}
		}
	}
	if quoted && i > 0 && word[i-1] == '"' {
		word[i-1] = 0
	}
	a.Name = cstring(word, 0)
	if a.HasValue {
		a.Value = cstring(word, valStart)
	}
	return a, end
}

// cstring is word from off up to the first NUL.
func cstring(word []byte, off int) string {
	if off >= len(word) {
		return ""
	}
	s := word[off:]
	for j, c := range s {
		if c == 0 {
			return string(s[:j])
		}
	}
	return string(s)
}

// Params are bcd ramdisk's settings, all from the kernel command line the site agent
// rendered into the machine's iPXE script.
type Params struct {
	// GatewayURL is bcd.gateway_url; ServerName bcd.server_name, the name the
	// gateway's certificate must carry.
	GatewayURL string
	ServerName string
	// Site is bcd.site.
	Site string
	// Pins are bcd.serving_ca_pin, bcd.join_signing_pin and bcd.join_encryption_pin.
	Pins pki.Pins
	// BootNonce is bcd.boot_nonce, minted by the site for this boot.
	BootNonce string
	// Proxy is bcd.proxy, the site agent's HTTP proxy; nil means direct.
	Proxy *url.URL
	// Witness is bcd.witness, the site agent's witness endpoint on its boot
	// server, asked directly (not through Proxy) to countersign the join; nil
	// when the site sent none (the control plane then refuses the join).
	Witness *url.URL
	// LogLevel is bcd.log (debug, info, warn or error; info when absent).
	LogLevel slog.Level
}

// LogValue shows the parameters without the nonce, which is the machine's one-time
// credential for the discovery join.
func (p Params) LogValue() slog.Value {
	proxy := "none"
	if p.Proxy != nil {
		proxy = p.Proxy.String()
	}
	return slog.GroupValue(
		slog.String("gateway_url", p.GatewayURL),
		slog.String("server_name", p.ServerName),
		slog.String("site", p.Site),
		slog.String("serving_ca_pin", p.Pins.ServingCA),
		slog.String("join_signing_pin", p.Pins.JoinSigning),
		slog.String("join_encryption_pin", p.Pins.JoinEncryption),
		slog.String("boot_nonce", fmt.Sprintf("(%d characters)", len(p.BootNonce))),
		slog.String("proxy", proxy),
		slog.String("witness", urlOrNone(p.Witness)),
		slog.String("log", strings.ToLower(p.LogLevel.String())),
	)
}

// ParamError is a kernel parameter that is missing or malformed. It names the
// parameter and never repeats the value (the nonce is a credential).
type ParamError struct {
	Name    string
	Problem string
}

func (e *ParamError) Error() string { return "kernel parameter " + e.Name + " " + e.Problem }

// CmdlineError lists every parameter that is wrong, in the order of Required, so an
// operator fixes the site's rendering once.
type CmdlineError struct {
	Params []*ParamError
}

func (e *CmdlineError) Error() string {
	parts := make([]string, len(e.Params))
	for i, p := range e.Params {
		parts[i] = p.Error()
	}
	return strings.Join(parts, "; ")
}

func urlOrNone(u *url.URL) string {
	if u == nil {
		return "none"
	}
	return u.String()
}

// Required are the parameters bcd ramdisk cannot start without.
var Required = []string{
	protocol.CmdlineGatewayURL,
	protocol.CmdlineServerName,
	protocol.CmdlineSite,
	protocol.CmdlineServingCAPin,
	protocol.CmdlineJoinSigningPin,
	protocol.CmdlineJoinEncryptionPin,
	protocol.CmdlineBootNonce,
}

// Nonce bounds: the site mints 32 random bytes in base64url (43 characters); the
// control plane takes 16 to 256.
const (
	minNonce = 16
	maxNonce = 256
)

// normalizeName treats - and _ alike, as the kernel does for parameter names.
func normalizeName(n string) string { return strings.ReplaceAll(n, "-", "_") }

// ParseParams reads Params from a kernel command line. allowHTTP accepts an http://
// gateway (development builds only). The last occurrence of a parameter wins, as for
// the kernel's own: the site renders its bcd.* after the operator's words.
func ParseParams(cmdline string, allowHTTP bool) (Params, error) {
	vals := map[string]Arg{}
	for _, a := range ParseCmdline(cmdline) {
		name := normalizeName(a.Name)
		if strings.HasPrefix(name, "bcd.") {
			vals[name] = a
		}
	}
	var p Params
	var errs []*ParamError
	bad := func(name, problem string) { errs = append(errs, &ParamError{Name: name, Problem: problem}) }
	get := func(name string, required bool) (string, bool) {
		a, ok := vals[name]
		switch {
		case !ok && required:
			bad(name, "is missing (the site agent renders it into the machine's iPXE script)")
			return "", false
		case !ok:
			return "", false
		case !a.HasValue || a.Value == "":
			bad(name, "is empty")
			return "", false
		}
		return a.Value, true
	}
	if v, ok := get(protocol.CmdlineGatewayURL, true); ok {
		if err := checkGatewayURL(v, allowHTTP); err != nil {
			bad(protocol.CmdlineGatewayURL, err.Error())
		} else {
			p.GatewayURL = v
		}
	}
	if v, ok := get(protocol.CmdlineServerName, true); ok {
		if !validServerName(v) {
			bad(protocol.CmdlineServerName, "is not a DNS name or an IP address")
		} else {
			p.ServerName = v
		}
	}
	if v, ok := get(protocol.CmdlineSite, true); ok {
		if !validWord(v, 128) {
			bad(protocol.CmdlineSite, "is not a site name (at most 128 printable characters, no quotes)")
		} else {
			p.Site = v
		}
	}
	for _, pin := range []struct {
		name string
		dst  *string
	}{
		{protocol.CmdlineServingCAPin, &p.Pins.ServingCA},
		{protocol.CmdlineJoinSigningPin, &p.Pins.JoinSigning},
		{protocol.CmdlineJoinEncryptionPin, &p.Pins.JoinEncryption},
	} {
		v, ok := get(pin.name, true)
		if !ok {
			continue
		}
		if err := config.ValidatePin(v); err != nil {
			bad(pin.name, "is not a pin: "+err.Error())
			continue
		}
		if _, err := pki.ParsePin(v); err != nil {
			bad(pin.name, "is not a pin: "+err.Error())
			continue
		}
		*pin.dst = v
	}
	if v, ok := get(protocol.CmdlineBootNonce, true); ok {
		if !validNonce(v) {
			bad(protocol.CmdlineBootNonce, fmt.Sprintf("is not a boot nonce (%d to %d printable characters, no quotes)", minNonce, maxNonce))
		} else {
			p.BootNonce = v
		}
	}
	if v, ok := get(protocol.CmdlineProxy, false); ok {
		u, err := agent.ParseProxyURL(v)
		if err != nil {
			bad(protocol.CmdlineProxy, "is not an HTTP proxy: "+err.Error())
		} else {
			p.Proxy = u
		}
	}
	if v, ok := get(protocol.CmdlineWitness, false); ok {
		u, err := url.Parse(v)
		// Canonical only (String gives v back): what is logged and asked is
		// what the site rendered.
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.String() != v {
			bad(protocol.CmdlineWitness, "is not an http:// or https:// URL")
		} else {
			p.Witness = u
		}
	}
	p.LogLevel = slog.LevelInfo
	if v, ok := get(protocol.CmdlineLog, false); ok {
		switch v {
		case "debug":
			p.LogLevel = slog.LevelDebug
		case "info":
		case "warn":
			p.LogLevel = slog.LevelWarn
		case "error":
			p.LogLevel = slog.LevelError
		default:
			bad(protocol.CmdlineLog, "is not a log level (debug, info, warn or error)")
		}
	}
	if len(errs) > 0 {
		return Params{}, &CmdlineError{Params: errs}
	}
	return p, nil
}

// ReadParams reads the command line at path (DefaultCmdlinePath on a machine) and
// parses it. A file that cannot be read is an error of its own, not a CmdlineError.
func ReadParams(path string, allowHTTP bool) (Params, error) {
	f, err := os.Open(path)
	if err != nil {
		return Params{}, fmt.Errorf("read the kernel command line: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxCmdline+1))
	if err != nil {
		return Params{}, fmt.Errorf("read the kernel command line %s: %w", path, err)
	}
	if len(b) > MaxCmdline {
		return Params{}, fmt.Errorf("the kernel command line %s is over %d bytes", path, MaxCmdline)
	}
	return ParseParams(string(b), allowHTTP)
}

// IsCmdlineError reports whether err is about the command line's parameters (a
// usage error: exit 2) rather than about reading it.
func IsCmdlineError(err error) bool {
	var ce *CmdlineError
	return errors.As(err, &ce)
}

func checkGatewayURL(v string, allowHTTP bool) error {
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return errors.New("is not a URL")
	case u.Scheme == "http" && !allowHTTP:
		return errors.New("must be https:// (http:// only in a development build)")
	case u.Scheme != "https" && u.Scheme != "http":
		return errors.New("must be an https:// URL")
	case u.Hostname() == "":
		return errors.New("has no host")
	case u.User != nil:
		return errors.New("must not carry a user name or password")
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return errors.New("must not have a query or fragment")
	}
	return nil
}

func validServerName(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	if len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// validWord is printable ASCII without spaces, quotes or backslashes.
func validWord(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '"' || c == '\'' || c == '\\' || c == '`' {
			return false
		}
	}
	return true
}

// validNonce is the control plane's rule (16 to 256 printable ASCII characters, no
// spaces, quotes or backslashes): the site mints base64url, but the ramdisk refuses
// only what the discovery attestor would.
func validNonce(s string) bool {
	return len(s) >= minNonce && validWord(s, maxNonce)
}
