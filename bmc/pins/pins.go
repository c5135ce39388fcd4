package pins

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
)

// FileName is the pins file's name inside a plugin directory.
const FileName = "pins"

// MaxSize bounds a pins file.
const MaxSize = 64 << 10

// Pin is one plugin's expected digest and where it was written.
type Pin struct {
	SHA256 [32]byte
	Line   int
}

// Pins maps a plugin name to its pin.
type Pins map[string]Pin

// Lookup returns name's pin.
func (p Pins) Lookup(name string) (Pin, bool) {
	pin, ok := p[name]
	return pin, ok
}

// Parse reads a pins file. Every line is "<64 hex digits>  <name>" (sha256sum's text
// mode) or "<64 hex digits> *<name>" (its binary mode); empty lines and lines
// starting with # are ignored. Anything else is an error naming the line, and so
// is a plugin pinned twice: a file bcd cannot read exactly pins nothing.
func Parse(data []byte) (Pins, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("pins file is larger than %d bytes", MaxSize)
	}
	p := Pins{}
	for i, raw := range bytes.Split(data, []byte("\n")) {
		n := i + 1
		line := string(raw)
		if line == "" || line[0] == '#' {
			continue
		}
		if strings.ContainsAny(line, "\r\x00") {
			return nil, fmt.Errorf("pins file line %d: carriage return or NUL byte", n)
		}
		if len(line) < 64+2+1 {
			return nil, fmt.Errorf("pins file line %d: want \"<sha256>  <name>\"", n)
		}
		var sum [32]byte
		if _, err := hex.Decode(sum[:], []byte(line[:64])); err != nil {
			return nil, fmt.Errorf("pins file line %d: the digest is not 64 hex digits", n)
		}
		sep, name := line[64:66], line[66:]
		if sep != "  " && sep != " *" {
			return nil, fmt.Errorf("pins file line %d: want two spaces (or \" *\") between the digest and the name", n)
		}
		if !ValidName(name) {
			return nil, fmt.Errorf("pins file line %d: %q is not a plugin name (letters, digits, ., _ and -)", n, name)
		}
		if prev, dup := p[name]; dup {
			return nil, fmt.Errorf("pins file line %d: %s is already pinned on line %d", n, name, prev.Line)
		}
		p[name] = Pin{SHA256: sum, Line: n}
	}
	return p, nil
}

// ValidName reports whether s may name a plugin: letters, digits, ., _ and -, at most
// 64 bytes, not . or .., and not the pins file itself.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 || s == "." || s == ".." || s == FileName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Format renders one line of a pins file, as sha256sum writes it.
func Format(name string, sum [32]byte) string {
	return hex.EncodeToString(sum[:]) + "  " + name + "\n"
}
