package config

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A document is the file as TOML sees it, before any key means anything.
// The fuzz test holds it against a full TOML parser.
type document struct {
	tables []*table // tables[0] is the top level
}

type table struct {
	name string
	line int
	keys []entry
	seen map[string]int // key → line
}

type entry struct {
	key  string
	val  any // string, int64 or bool
	line int
}

// parseDocument reads data line by line. The subset has no value that spans
// lines, so a bad line costs only itself and every error is found.
func parseDocument(data []byte) (*document, ErrorList) {
	var errs ErrorList
	top := &table{seen: map[string]int{}}
	doc := &document{tables: []*table{top}}
	headers := map[string]int{}
	cur := top // nil after a bad header: its keys belong nowhere
	data = bytes.TrimPrefix(data, []byte("\uFEFF"))
	for n := 1; len(data) > 0; n++ {
		raw, rest, lf := bytes.Cut(data, []byte("\n"))
		data = rest
		if lf {
			raw = bytes.TrimSuffix(raw, []byte("\r"))
		}
		fail := func(format string, args ...any) {
			errs = append(errs, &Error{Line: n, Msg: fmt.Sprintf(format, args...)})
		}
		if msg := checkChars(raw); msg != "" {
			fail("%s", msg)
			if isHeader(raw) {
				cur = nil
			}
			continue
		}
		l, msg := parseLine(string(raw))
		switch {
		case msg != "":
			fail("%s", msg)
			if l.header {
				cur = nil
			}
		case l.header:
			cur = nil
			if first, ok := headers[l.key]; ok {
				fail("duplicate section [%s] (first on line %d)", l.key, first)
			} else if first, ok := top.seen[l.key]; ok {
				fail("section [%s] redefines the key %q on line %d", l.key, l.key, first)
			} else {
				headers[l.key] = n
				cur = &table{name: l.key, line: n, seen: map[string]int{}}
				doc.tables = append(doc.tables, cur)
			}
		case l.key != "" && cur != nil:
			if first, ok := cur.seen[l.key]; ok {
				fail("duplicate key %q (first on line %d)", l.key, first)
				continue
			}
			cur.seen[l.key] = n
			cur.keys = append(cur.keys, entry{key: l.key, val: l.val, line: n})
		}
	}
	return doc, errs
}

func isHeader(raw []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(raw, " \t"), []byte("["))
}

// checkChars refuses what TOML refuses anywhere in a line, comments and
// strings included, and C1 controls too.
func checkChars(b []byte) string {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return "invalid UTF-8"
		case r == '\r':
			return "carriage return not followed by a line feed"
		case r != '\t' && unicode.IsControl(r):
			return fmt.Sprintf("control character %U is not allowed", r)
		}
		i += size
	}
	return ""
}

// line is one parsed line: a header, a key and its value, or neither.
type line struct {
	header bool
	key    string // or the section name
	val    any
}

// parseLine reads a line that checkChars passed.
func parseLine(s string) (line, string) {
	c := &cursor{s: s}
	if c.end() {
		return line{}, ""
	}
	if c.peek() == '[' {
		name, msg := c.header()
		return line{header: true, key: name}, msg
	}
	key, msg := c.key("key")
	if msg != "" {
		return line{}, msg
	}
	afterKey := c.i
	c.ws()
	switch {
	case c.peek() == '.':
		return line{}, "dotted keys are not supported"
	case c.i == len(c.s):
		return line{}, fmt.Sprintf("expected \"=\" after key %q", key)
	case c.peek() != '=' && c.i == afterKey:
		return line{}, fmt.Sprintf("invalid character %q in key %q", c.rune(), key)
	case c.peek() != '=':
		return line{}, fmt.Sprintf("expected \"=\" after key %q, found %q", key, c.rune())
	}
	c.i++
	if c.end() {
		return line{}, fmt.Sprintf("missing value for key %q", key)
	}
	val, msg := c.value()
	if msg != "" {
		return line{}, fmt.Sprintf("%s (key %q)", msg, key)
	}
	if !c.end() {
		return line{}, fmt.Sprintf("unexpected %q after the value of key %q", c.rune(), key)
	}
	return line{key: key, val: val}, ""
}

type cursor struct {
	s string
	i int
}

func (c *cursor) peek() byte {
	if c.i < len(c.s) {
		return c.s[c.i]
	}
	return 0
}

func (c *cursor) rune() rune {
	r, _ := utf8.DecodeRuneInString(c.s[c.i:])
	return r
}

func (c *cursor) ws() {
	for c.i < len(c.s) && (c.s[c.i] == ' ' || c.s[c.i] == '\t') {
		c.i++
	}
}

// end skips whitespace and reports whether only a comment, if anything, is left.
func (c *cursor) end() bool {
	c.ws()
	return c.i == len(c.s) || c.s[c.i] == '#'
}

func isBare(b byte) bool {
	return b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '_' || b == '-'
}

func (c *cursor) key(what string) (string, string) {
	start := c.i
	for c.i < len(c.s) && isBare(c.s[c.i]) {
		c.i++
	}
	if c.i > start {
		return c.s[start:c.i], ""
	}
	switch c.peek() {
	case '"', '\'':
		return "", fmt.Sprintf("quoted %ss are not supported", what)
	case '=':
		return "", fmt.Sprintf("missing %s before \"=\"", what)
	case ']', 0:
		return "", fmt.Sprintf("missing %s", what)
	}
	return "", fmt.Sprintf("invalid character %q in %s", c.rune(), what)
}

func (c *cursor) header() (string, string) {
	c.i++
	if c.peek() == '[' {
		return "", "array tables ([[...]]) are not supported"
	}
	c.ws()
	name, msg := c.key("section name")
	if msg != "" {
		return "", msg
	}
	c.ws()
	switch c.peek() {
	case ']':
	case '.':
		return "", "dotted section names are not supported"
	case 0:
		return "", "missing \"]\" after the section name"
	default:
		return "", fmt.Sprintf("invalid character %q in section name", c.rune())
	}
	c.i++
	if !c.end() {
		return "", fmt.Sprintf("unexpected %q after [%s]", c.rune(), name)
	}
	return name, ""
}

func (c *cursor) value() (any, string) {
	rest := c.s[c.i:]
	switch {
	case strings.HasPrefix(rest, `"""`), strings.HasPrefix(rest, `'''`):
		return nil, "multi-line strings are not supported"
	case rest[0] == '"':
		return c.basic()
	case rest[0] == '\'':
		end := strings.IndexByte(rest[1:], '\'')
		if end < 0 {
			return nil, "unterminated string"
		}
		c.i += end + 2
		return rest[1 : end+1], ""
	case rest[0] == '[':
		return nil, "arrays are not supported; write a list as one comma-separated string"
	case rest[0] == '{':
		return nil, "inline tables are not supported"
	}
	start := c.i
	for c.i < len(c.s) && c.s[c.i] != ' ' && c.s[c.i] != '\t' && c.s[c.i] != '#' {
		c.i++
	}
	return scalar(c.s[start:c.i])
}

func (c *cursor) basic() (any, string) {
	var b strings.Builder
	for c.i++; c.i < len(c.s); {
		switch ch := c.s[c.i]; ch {
		case '"':
			c.i++
			return b.String(), ""
		case '\\':
			r, msg := c.escape()
			if msg != "" {
				return nil, msg
			}
			b.WriteRune(r)
		default:
			b.WriteByte(ch)
			c.i++
		}
	}
	return nil, "unterminated string"
}

var escapes = map[byte]rune{'b': '\b', 't': '\t', 'n': '\n', 'f': '\f', 'r': '\r', '"': '"', '\\': '\\'}

func (c *cursor) escape() (rune, string) {
	c.i++ // the backslash
	if c.i == len(c.s) {
		return 0, "unterminated string"
	}
	e := c.s[c.i]
	if r, ok := escapes[e]; ok {
		c.i++
		return r, ""
	}
	n := map[byte]int{'u': 4, 'U': 8}[e]
	if n == 0 {
		return 0, fmt.Sprintf("invalid escape \\%c in string", c.rune())
	}
	hex := c.s[c.i+1 : min(c.i+1+n, len(c.s))]
	if len(hex) < n || strings.IndexFunc(hex, func(r rune) bool { return !isHex(r) }) >= 0 {
		return 0, fmt.Sprintf("\\%c needs %d hexadecimal digits", e, n)
	}
	v, _ := strconv.ParseUint(hex, 16, 32)
	r := rune(v)
	if v > unicode.MaxRune || !utf8.ValidRune(r) {
		return 0, fmt.Sprintf("\\%c%s is not a Unicode scalar value", e, hex)
	}
	c.i += 1 + n
	return r, ""
}

func isHex(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F'
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

// scalar reads an unquoted value, naming what TOML would have read where the
// subset has no such thing.
func scalar(tok string) (any, string) {
	switch tok {
	case "true":
		return true, ""
	case "false":
		return false, ""
	}
	body := tok
	if tok[0] == '+' || tok[0] == '-' {
		body = tok[1:]
	}
	switch {
	case body == "inf" || body == "nan":
		return nil, "floats are not supported"
	case len(body) > 1 && body[0] == '0' && strings.IndexByte("xob", body[1]) >= 0:
		return nil, "hexadecimal, octal and binary integers are not supported"
	case strings.Contains(tok, ":") || isDate(tok):
		return nil, "dates and times are not supported"
	case body != "" && isDigit(body[0]) && strings.ContainsAny(body, ".eE"):
		return nil, "floats are not supported"
	case body == "" || !isDigit(body[0]) && body[0] != '_':
		return nil, fmt.Sprintf("invalid value %s (strings must be quoted)", tok)
	}
	for i := 0; i < len(body); i++ {
		switch {
		case isDigit(body[i]):
		case body[i] == '_':
			if i == 0 || i == len(body)-1 || !isDigit(body[i-1]) || !isDigit(body[i+1]) {
				return nil, fmt.Sprintf("invalid integer %s: _ must be between digits", tok)
			}
		default:
			return nil, fmt.Sprintf("invalid integer %s", tok)
		}
	}
	if body[0] == '0' && len(body) > 1 {
		return nil, fmt.Sprintf("invalid integer %s: leading zeros are not allowed", tok)
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(tok, "_", ""), 10, 64)
	if err != nil {
		return nil, fmt.Sprintf("integer %s does not fit in 64 bits", tok)
	}
	return n, ""
}

// isDate matches the YYYY-MM-DD a TOML date starts with.
func isDate(s string) bool {
	if len(s) < 10 || s[4] != '-' || s[7] != '-' {
		return false
	}
	for _, i := range []int{0, 1, 2, 3, 5, 6, 8, 9} {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}
