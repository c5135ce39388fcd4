// Package config reads /etc/bcd/config.toml, the one configuration file of
// bcd node, bcd site and bcd helper.
//
// The file is a strict subset of TOML 1.0, small enough that every accepted
// document means the same to any TOML parser, and strict enough that a typo
// fails loudly instead of being ignored:
//
//   - bare keys ([A-Za-z0-9_-]+) in the top level or in a bare [section];
//   - basic strings with the TOML escapes, literal strings, decimal integers
//     (optional sign, _ only between digits, no leading zeros) and booleans;
//   - comments, blank lines, LF or CRLF line ends, and a leading UTF-8 BOM.
//
// Arrays, inline tables, floats, dates and times, multi-line strings, dotted
// or quoted keys, [[array tables]], unknown keys or sections, duplicates,
// wrong types and control characters are errors. Parse reports all of them,
// each with its line, so `bcd config check` can print every one. Files over
// MaxSize are refused before they are parsed.
//
// Lists are written as one comma-separated string, since arrays are not in
// the subset:
//
//	[plugins]
//	privileged = "kata, gvisor"
//
// Spaces around items are trimmed; an empty item or a repeated one is an
// error, and "" is the empty list.
//
// A section absent from the file leaves its pointer in Config nil, so
// callers can ask whether the node has, say, a [plugins] section. Defaults
// fill the keys a present section leaves out; JournalOrDefault, LogOrDefault
// and UpdateOrDefault give the defaults of an absent one.
//
// Every error Parse and Load find in a document is an *Error, so a caller
// can tell a bad file (a usage error: bcd site exits 2) from an I/O error.
// Format renders a Config back into a file that parses to the same Config.
package config
