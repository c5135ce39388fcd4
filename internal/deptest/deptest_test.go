package deptest

import (
	"slices"
	"testing"
)

func TestMatches(t *testing.T) {
	for _, c := range []struct {
		dep, bad string
		want     bool
	}{
		{"modernc.org/sqlite", "modernc.org/", true},
		{"modernc.org", "modernc.org/", false},
		{"database/sql", "database/sql", true},
		{"database/sql/driver", "database/sql", true},
		{"database/sqlx", "database/sql", false},
		{"x/controlplane/store/sqlite", "x/controlplane/store", true},
		{"x/controlplane/storetest", "x/controlplane/store", false},
	} {
		if got := matches(c.dep, c.bad); got != c.want {
			t.Errorf("matches(%q, %q) = %v, want %v", c.dep, c.bad, got, c.want)
		}
	}
}

// TestChains: each package is reached once, by a shortest chain.
func TestChains(t *testing.T) {
	imports := map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"d", "a"}, "d": nil}
	got := map[string][]string{}
	for _, c := range chains("a", imports) {
		last := c[len(c)-1]
		if _, dup := got[last]; dup {
			t.Errorf("%s reached twice", last)
		}
		got[last] = c
	}
	for pkg, want := range map[string][]string{"a": {"a"}, "b": {"a", "b"}, "c": {"a", "c"}, "d": {"a", "b", "d"}} {
		if !slices.Equal(got[pkg], want) {
			t.Errorf("chain to %s = %v, want %v", pkg, got[pkg], want)
		}
	}
}
