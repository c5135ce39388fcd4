package config

import (
	"bytes"
	"fmt"
	"strconv"
	"unicode"
)

// Format renders c as a configuration file: the top-level keys, then every
// present section, leaving out values that are zero or their default. For a
// c that Parse returned, Parse(Format(c)) gives c back.
func Format(c *Config) []byte {
	var b bytes.Buffer
	for i := range schema {
		s := &schema[i]
		if !s.present(c) {
			continue
		}
		if s.name != "" {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "[%s]\n", s.name)
		}
		for _, f := range s.fields {
			v := f.get(c)
			def := any(nil)
			if f.def != nil {
				def = f.def(c)
			}
			// A zero string or integer means unset; false is a value
			// only where the default is true.
			if v == def || v == "" || v == int64(0) || v == false && def == nil {
				continue
			}
			fmt.Fprintf(&b, "%s = %s\n", f.name, render(v))
		}
	}
	return b.Bytes()
}

func render(v any) string {
	switch v := v.(type) {
	case string:
		return quote(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	}
	return fmt.Sprint(v)
}

// quote writes a TOML basic string that the subset reads back as s. Control
// characters are escaped, the subset refusing them raw; invalid UTF-8
// becomes U+FFFD.
func quote(s string) string {
	var b bytes.Buffer
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if unicode.IsControl(r) {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
