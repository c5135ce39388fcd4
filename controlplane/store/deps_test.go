package store_test

import (
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/better-compute/bcd"

// forbidden reports why the package at path may not be a dependency of the
// store's interfaces or of the suite, "" when it may.
func forbidden(path string) string {
	switch {
	case strings.HasPrefix(path, "modernc.org/"):
		return "a database implementation (modernc.org)"
	case path == "database/sql" || strings.HasPrefix(path, "database/sql/"):
		return "SQL (database/sql)"
	case strings.HasPrefix(path, "github.com/jackc/"), strings.HasPrefix(path, "github.com/lib/pq"):
		return "a PostgreSQL driver"
	case strings.HasPrefix(path, module+"/controlplane/store/") && path != module+"/controlplane/store/storetest":
		return "a store implementation"
	}
	return ""
}

// TestInterfacesImportNoImplementation keeps the store's interfaces and its
// conformance suite free of every implementation: a package that depends on
// them links no database driver, and the suite tests each implementation
// the same, through the interfaces alone.
func TestInterfacesImportNoImplementation(t *testing.T) {
	for _, pkg := range []string{module + "/controlplane/store", module + "/controlplane/store/storetest"} {
		t.Run(strings.TrimPrefix(pkg, module+"/"), func(t *testing.T) {
			imports := listImports(t, pkg)
			if len(imports) == 0 {
				t.Fatalf("go list -deps %s listed nothing", pkg)
			}
			// Each forbidden package is named once, with how it is reached,
			// unless it is reached through another one (modernc.org/libc
			// through modernc.org/sqlite): the first one is what to remove.
			for _, path := range slices.Sorted(maps.Keys(imports)) {
				why := forbidden(path)
				if why == "" {
					continue
				}
				c := chain(imports, pkg, path)
				if slices.ContainsFunc(c[:len(c)-1], func(p string) bool { return forbidden(p) != "" }) {
					continue
				}
				t.Errorf("%s must not depend on %s (%s), imported through %s", pkg, path, why, strings.Join(c, " → "))
			}
		})
	}
}

func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		path string
		bad  bool
	}{
		{"modernc.org/sqlite", true},
		{"modernc.org/libc", true},
		{"database/sql", true},
		{"database/sql/driver", true},
		{"github.com/jackc/pgx/v5", true},
		{"github.com/lib/pq", true},
		{module + "/controlplane/store/sqlite", true},
		{module + "/controlplane/store/postgres", true},
		{module + "/controlplane/store", false},
		{module + "/controlplane/store/storetest", false},
		{module + "/controlplane/token", false},
		{"encoding/json", false},
	} {
		if got := forbidden(tc.path) != ""; got != tc.bad {
			t.Errorf("forbidden(%q) = %v, want %v", tc.path, got, tc.bad)
		}
	}
}

// listImports returns every package pkg depends on (pkg included, test files
// left out), each with the packages it imports.
func listImports(t *testing.T, pkg string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pkg).Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + strings.TrimSpace(string(ee.Stderr))
		}
		t.Fatalf("go list -deps %s: %s", pkg, msg)
	}
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 {
			imports[f[0]] = f[1:]
		}
	}
	return imports
}

// chain is a shortest import path from from to to, for the message.
func chain(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var c []string
			for ; p != ""; p = prev[p] {
				c = append(c, p)
			}
			slices.Reverse(c)
			return c
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return []string{from, "…", to}
}
