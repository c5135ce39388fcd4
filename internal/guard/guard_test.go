package guard

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/better-compute/bcd"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found: %v", err)
	}
	return root
}

// TestEveryPackageHasADoc: a package nobody can explain in a sentence is two packages.
func TestEveryPackageHasADoc(t *testing.T) {
	root := repoRoot(t)
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin" || d.Name() == "dist") && path != root {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range dirs {
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		for name, pkg := range pkgs {
			documented := false
			for _, f := range pkg.Files {
				if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
					documented = true
				}
			}
			if !documented {
				rel, _ := filepath.Rel(root, dir)
				t.Errorf("package %s in %s has no package comment (add a doc.go saying what it is for)", name, rel)
			}
		}
	}
}

func deps(t *testing.T, pkg string, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestBcdStaysAnAgent keeps control-plane and database code (and the TFTP library
// the tests use as a client) out of the agent binary,
// which runs on every server and in the ramdisk.
func TestBcdStaysAnAgent(t *testing.T) {
	for _, tags := range []string{"", "fakehw"} {
		for _, d := range deps(t, module+"/cmd/bcd", tags) {
			switch {
			case strings.HasPrefix(d, module+"/controlplane"):
				t.Errorf("bcd (tags %q) imports %s", tags, d)
			case strings.HasPrefix(d, "modernc.org/sqlite"), strings.HasPrefix(d, "modernc.org/libc"):
				t.Errorf("bcd (tags %q) imports %s", tags, d)
			case strings.HasPrefix(d, "github.com/pin/tftp"):
				// boot's TFTP server is bcd's own sender; pin/tftp is the tests' client.
				t.Errorf("bcd (tags %q) imports %s", tags, d)
			}
		}
	}
}

// TestAgentModesStayApart: node, site and ramdisk share code through agent/ only.
func TestAgentModesStayApart(t *testing.T) {
	modes := []string{"nodeagent", "site", "ramdisk", "agent"}
	root := repoRoot(t)
	for _, m := range modes {
		if _, err := os.Stat(filepath.Join(root, m)); err != nil {
			continue
		}
		for _, d := range deps(t, module+"/"+m+"/...", "") {
			for _, other := range modes {
				if other != m && other != "agent" && (d == module+"/"+other || strings.HasPrefix(d, module+"/"+other+"/")) {
					t.Errorf("%s imports %s: share it through agent/ instead", m, d)
				}
			}
			if strings.HasPrefix(d, module+"/controlplane") {
				t.Errorf("%s imports %s", m, d)
			}
		}
	}
}
