package helper

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/internal/buildmode"
)

// under is the problems below the tree: in a default build the chains start
// at /, and what lies between / and the test's temporary directory (/tmp is
// 1777) is the test machine's, not the tree's.
func (tr *tree) under(probs []Problem) []Problem {
	var out []Problem
	for _, p := range probs {
		if strings.HasPrefix(p.Path, tr.root) {
			out = append(out, p)
		}
	}
	return out
}

// checkOutside asserts what lies outside the tree: nothing in a fakehw build,
// whose chains start at the tree (EnvTestTrustedRoot), and in a default
// build, which ignores it, the world-writable temporary directory the tree
// is in.
func (tr *tree) checkOutside(probs []Problem) {
	tr.t.Helper()
	var outside []Problem
	for _, p := range probs {
		if !strings.HasPrefix(p.Path, tr.root) {
			outside = append(outside, p)
		}
	}
	if buildmode.FakeHW {
		if len(outside) > 0 {
			tr.t.Errorf("a fakehw build checked outside %s=%s: %v", EnvTestTrustedRoot, tr.root, outside)
		}
		return
	}
	// A default build: the chain from / reaches the tree through the
	// temporary directory, which must be reported if it is 1777.
	tmp := filepath.Dir(tr.root)
	fi, err := os.Stat(tmp)
	if err != nil {
		tr.t.Fatal(err)
	}
	if fi.Mode().Perm()&0o022 == 0 {
		return
	}
	for _, p := range outside {
		if p.Path == tmp && strings.Contains(p.What, "is writable by group or other") {
			return
		}
	}
	tr.t.Errorf("a default build did not report %s (mode %o) on the way from /: %v", tmp, fi.Mode().Perm(), outside)
}

func TestStartupProblems(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(tr *tree)
		want  func(tr *tree) []Problem
	}{
		{"a good tree", func(*tree) {}, func(*tree) []Problem { return nil }},
		{"a good tree whose slots directory does not exist yet", func(tr *tree) {
			if err := os.Remove(filepath.Dir(tr.slots)); err != nil {
				t.Fatal(err)
			}
		}, func(*tree) []Problem { return nil }},
		{"a group-writable /usr/local/lib (root:staff 2775)", func(tr *tree) {
			lib := filepath.Dir(tr.slots)
			if err := os.Chown(lib, 0, 50); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(lib, 0o775|os.ModeSetgid); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{filepath.Dir(tr.slots), "mode 2775 is writable by group or other (chmod go-w)"}}
		}},
		{"a config.toml the node user owns", func(tr *tree) {
			if err := os.Chown(tr.config, nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{tr.config, "owned by uid 65534, not root; the config decides what root does for the node, so only root may write it"}}
		}},
		{"a group-writable config.toml", func(tr *tree) {
			if err := os.Chmod(tr.config, 0o664); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{tr.config, "mode 0664 is writable by group or other (chmod go-w); the config decides what root does for the node, so only root may write it"}}
		}},
		{"config.toml in a directory the node owns", func(tr *tree) {
			if err := os.Chown(filepath.Dir(tr.config), nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{filepath.Dir(tr.config), "owned by uid 65534, not root"}}
		}},
		{"a socket directory the node owns", func(tr *tree) {
			if err := os.Chown(filepath.Dir(tr.socket), nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			d := filepath.Dir(tr.socket)
			return []Problem{{d, "the socket's directory: owned by uid 65534, not root"}, {d, "owned by uid 65534, not root"}}
		}},
		{"a socket directory anyone can write", func(tr *tree) {
			if err := os.Chmod(filepath.Dir(tr.socket), 0o777); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			d := filepath.Dir(tr.socket)
			return []Problem{{d, "the socket's directory: mode 0777 is writable by group or other (chmod go-w)"}, {d, "mode 0777 is writable by group or other (chmod go-w)"}}
		}},
		{"no socket directory", func(tr *tree) {
			if err := os.Remove(filepath.Dir(tr.socket)); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			d := filepath.Dir(tr.socket)
			return []Problem{{d, "lstat " + d + ": no such file or directory (bcd-helper.service's RuntimeDirectory=bcd-helper makes it)"}}
		}},
		{"a symlink on the way owned by the node user", func(tr *tree) {
			lib := filepath.Dir(tr.slots)
			real := filepath.Join(tr.root, "opt/lib")
			tr.mkdir(real, 0o755)
			if err := os.Remove(lib); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, lib); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(lib, nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{filepath.Dir(tr.slots), "a symlink owned by uid 65534, not root"}}
		}},
		{"a symlink on the way to a node-owned directory", func(tr *tree) {
			lib := filepath.Dir(tr.slots)
			real := filepath.Join(tr.root, "opt/lib")
			tr.mkdir(real, 0o755)
			if err := os.Chown(real, nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(lib); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, lib); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{filepath.Join(tr.root, "opt/lib"), "owned by uid 65534, not root"}}
		}},
		{"an entrypoint directory the node can write", func(tr *tree) {
			if err := os.Chmod(filepath.Dir(tr.entry), 0o757); err != nil {
				t.Fatal(err)
			}
		}, func(tr *tree) []Problem {
			return []Problem{{filepath.Dir(tr.entry), "mode 0757 is writable by group or other (chmod go-w)"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			tc.setup(tr)
			probs := StartupProblems(tr.load(), tr.config)
			if got, want := tr.under(probs), tc.want(tr); !reflect.DeepEqual(got, want) {
				t.Errorf("problems below the tree:\n got %v\nwant %v", got, want)
			}
			tr.checkOutside(probs)
			if len(probs) > 0 {
				err := ProblemsError(probs).Error()
				if !strings.HasPrefix(err, "bcd helper refuses to start:\n  ") || strings.Count(err, "\n  ") != len(probs) {
					t.Errorf("ProblemsError is not one problem a line:\n%s", err)
				}
			}
		})
	}
}

func TestStartupProblemsWithoutHelperSection(t *testing.T) {
	tr := newTree(t)
	c := tr.load()
	c.Helper = nil
	want := []Problem{{tr.config, "has no [helper] section; bcd helper runs only beside a bcd node configured for it"}}
	if got := StartupProblems(c, tr.config); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestCheckConfigFileNotRegular(t *testing.T) {
	tr := newTree(t)
	if err := os.Remove(tr.config); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(tr.config, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []Problem{{tr.config, "not a regular file (p---------)"}}
	if got := tr.under(CheckConfigFile(tr.config)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestTrustedRootOnlyInFakeHW: a host build starts every chain at /, whatever
// the environment says.
func TestTrustedRootOnlyInFakeHW(t *testing.T) {
	tr := newTree(t)
	got := trustedRoot()
	want := "/"
	if buildmode.FakeHW {
		want = tr.root
	}
	if got != want {
		t.Errorf("trustedRoot() = %q with %s=%s; want %q", got, EnvTestTrustedRoot, tr.root, want)
	}
	t.Setenv(EnvTestTrustedRoot, "relative/dir")
	if got := trustedRoot(); got != "/" {
		t.Errorf("a relative %s gave %q, want /", EnvTestTrustedRoot, got)
	}
}
