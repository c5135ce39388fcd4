package protocol

import "regexp"

// namePattern is what a name an operator gives may be: a site, a pool, a
// machine's name. Short, lowercase and free of separators, so it is safe in
// paths, tables, log lines and a SPIFFE id.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// NameRule says what ValidName accepts, for error messages.
const NameRule = "want 1 to 63 characters of a-z, 0-9, _, . and -, starting with a letter or digit"

// ValidName reports whether v is a name an operator may give a site, a pool
// or a machine.
func ValidName(v string) bool { return namePattern.MatchString(v) }
