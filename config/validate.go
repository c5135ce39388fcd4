package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"unicode"
)

// ValidatePin checks a public key pin: "sha256/" and the standard base64 of
// a SHA-256, the form HPKP and curl --pinnedpubkey use.
func ValidatePin(s string) error {
	b64, ok := strings.CutPrefix(s, "sha256/")
	if !ok {
		return errors.New(`a pin must start with "sha256/"`)
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return fmt.Errorf("a pin must be sha256/ and standard base64: %w", err)
	}
	if len(raw) != 32 {
		return fmt.Errorf("a pin must hold the 32 bytes of a SHA-256, not %d", len(raw))
	}
	// The decoder skips line breaks; a pin is compared as text, so it
	// must be written exactly one way.
	if base64.StdEncoding.EncodeToString(raw) != b64 {
		return errors.New("a pin must be sha256/ and standard base64 without line breaks")
	}
	return nil
}

func pin(s string) (string, error) {
	if err := ValidatePin(s); err != nil {
		return "", fmt.Errorf("%q: %w", s, err)
	}
	return s, nil
}

func hasControl(s string) bool { return strings.IndexFunc(s, unicode.IsControl) >= 0 }

func printable(s string) (string, error) {
	if hasControl(s) {
		return "", errors.New("must not contain control characters")
	}
	return s, nil
}

func text(s string) (string, error) {
	if s == "" {
		return "", errors.New("must not be empty")
	}
	return printable(s)
}

// absPath cleans the path, so that a prefix check on it means what it says.
func absPath(s string) (string, error) {
	if !path.IsAbs(s) {
		return "", fmt.Errorf("%q is not an absolute path", s)
	}
	if hasControl(s) {
		return "", errors.New("must not contain control characters")
	}
	return path.Clean(s), nil
}

// The kernel's sockaddr_un holds 108 bytes of path.
const maxSocketPath = 108

func socketPath(s string) (string, error) {
	p, err := absPath(s)
	if err == nil && len(p) > maxSocketPath {
		return "", fmt.Errorf("a unix socket path is at most %d bytes, not %d", maxSocketPath, len(p))
	}
	return p, err
}

func cgroupPath(s string) (string, error) {
	p, err := absPath(s)
	if err == nil && !strings.HasPrefix(p, "/sys/fs/cgroup/") {
		return "", fmt.Errorf("%q is not below /sys/fs/cgroup", s)
	}
	return p, err
}

// webURL takes http and https; gateway_url narrows it to https in checkTop.
func webURL(s string) (string, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", err
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q is not an http:// or https:// URL", s)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("%q has no host", s)
	case u.User != nil:
		return "", fmt.Errorf("%q must not carry a user name or password", s)
	}
	return s, nil
}

func dnsName(s string) (string, error) {
	if len(s) > 253 {
		return "", errors.New("a DNS name is at most 253 bytes")
	}
	for _, label := range strings.Split(s, ".") {
		if !validLabel(label) {
			return "", fmt.Errorf("%q is not a DNS name", s)
		}
	}
	return s, nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		if b := l[i]; !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-') {
			return false
		}
	}
	return true
}

// hostPort is an address to listen on: an empty host is every address.
func hostPort(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", fmt.Errorf("%q has no valid port", s)
	}
	if host == "" {
		return s, nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return s, nil
	}
	if _, err := dnsName(host); err != nil {
		return "", fmt.Errorf("%q: %q is neither an IP address nor a DNS name", s, host)
	}
	return s, nil
}

func ipv4(s string) (string, error) {
	if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
		return "", fmt.Errorf("%q is not an IPv4 address", s)
	}
	return s, nil
}

// ifName is the kernel's dev_valid_name.
func ifName(s string) (string, error) {
	bad := func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) }
	if s == "" || len(s) > 15 || s == "." || s == ".." || strings.IndexFunc(s, bad) >= 0 {
		return "", fmt.Errorf("%q is not a network interface name (1 to 15 bytes, no /, : or spaces)", s)
	}
	return s, nil
}

// pluginName names a file in [plugins] dir, so "." and ".." are out too.
func pluginName(s string) (string, error) {
	if s == "." || s == ".." || !only(s, func(b byte) bool {
		return isBare(b) || b == '.'
	}) {
		return "", fmt.Errorf("%q is not a plugin name (letters, digits, ., _ and -)", s)
	}
	return s, nil
}

func userName(s string) (string, error) {
	if s == "" || len(s) > 32 || isDigit(s[0]) || s[0] == '-' || !only(s, func(b byte) bool {
		return b >= 'a' && b <= 'z' || isDigit(b) || b == '_' || b == '-'
	}) {
		return "", fmt.Errorf("%q is not a user name ([a-z_][a-z0-9_-]*, at most 32)", s)
	}
	return s, nil
}

var unitSuffixes = []string{".service", ".timer", ".socket", ".target"}

func unitName(s string) (string, error) {
	ok := len(s) <= 255 && only(s, func(b byte) bool {
		return isBare(b) || b == ':' || b == '.' || b == '@'
	})
	for _, suffix := range unitSuffixes {
		if ok && len(s) > len(suffix) && strings.HasSuffix(s, suffix) {
			return s, nil
		}
	}
	return "", fmt.Errorf("%q is not a systemd unit name ending in %s", s, strings.Join(unitSuffixes, ", "))
}

func sha256Hex(s string) (string, error) {
	if len(s) != 64 || !only(s, func(b byte) bool { return isDigit(b) || b >= 'a' && b <= 'f' }) {
		return "", errors.New("must be 64 lowercase hexadecimal digits")
	}
	return s, nil
}

func oneOf(values ...string) func(string) (string, error) {
	return func(s string) (string, error) {
		for _, v := range values {
			if s == v {
				return s, nil
			}
		}
		return "", fmt.Errorf("%q is not one of %s", s, strings.Join(values, ", "))
	}
}

// only reports whether s is non-empty and every byte passes ok.
func only(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return s != ""
}
