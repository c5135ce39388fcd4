// Package deptest is for guard tests that keep a package's dependencies as
// intended (as tailscale's tstest/deptest does): a test names the packages
// that must not come back, and a failure shows the import chain that brought
// one in, so the fix is obvious.
package deptest

import (
	"os/exec"
	"strings"
	"testing"
)

// Forbid fails t for every package in pkg's dependencies (go list -deps,
// from the current directory, with build tags tags) that is one of bad or
// below one of them ("modernc.org/" matches every modernc.org module;
// "database/sql" matches it and database/sql/driver).
func Forbid(t *testing.T, pkg, tags string, bad ...string) {
	t.Helper()
	args := []string{"list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command("go", append(args, pkg)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	imports := map[string][]string{}
	root := ""
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		imports[f[0]] = f[1:]
		root = f[0] // go list -deps lists the package itself last
	}
	// Only where a chain first enters a forbidden package is reported:
	// what store drags in after it is the same mistake.
	for _, chain := range chains(root, imports)[1:] { // not pkg itself
		d := chain[len(chain)-1]
		if b := forbidden(d, bad); b != "" && !anyForbidden(chain[1:len(chain)-1], bad) {
			t.Errorf("%s depends on %s (forbidden: %s), through %s", root, d, b, strings.Join(chain, " → "))
		}
	}
}

// forbidden is the entry of bad that dep matches, "" for none.
func forbidden(dep string, bad []string) string {
	for _, b := range bad {
		if matches(dep, b) {
			return b
		}
	}
	return ""
}

func anyForbidden(deps, bad []string) bool {
	for _, d := range deps {
		if forbidden(d, bad) != "" {
			return true
		}
	}
	return false
}

func matches(dep, bad string) bool {
	if strings.HasSuffix(bad, "/") {
		return strings.HasPrefix(dep, bad)
	}
	return dep == bad || strings.HasPrefix(dep, bad+"/")
}

// chains is, for every package reachable from root, one shortest import
// chain from root to it.
func chains(root string, imports map[string][]string) [][]string {
	seen := map[string]bool{root: true}
	queue := [][]string{{root}}
	var out [][]string
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		out = append(out, c)
		for _, next := range imports[c[len(c)-1]] {
			if !seen[next] {
				seen[next] = true
				queue = append(queue, append(append([]string(nil), c...), next))
			}
		}
	}
	return out
}
