package helper

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
)

// EnvTestTrustedRoot, in a fakehw build only, is a directory the ownership
// chains start at instead of /: tests keep their trees under a temporary
// directory, and /tmp (1777) would fail every chain. A host build ignores it.
const EnvTestTrustedRoot = "BCD_FAKEHW_HELPER_TRUSTED_ROOT"

// Problem is one path the helper will not start on, and what is wrong with it.
type Problem struct {
	Path string
	What string
}

func (p Problem) String() string { return p.Path + ": " + p.What }

// ProblemsError is the helper's refusal to start: every Problem, one a line.
type ProblemsError []Problem

func (e ProblemsError) Error() string {
	s := make([]string, len(e))
	for i, p := range e {
		s[i] = p.String()
	}
	return "bcd helper refuses to start:\n  " + strings.Join(s, "\n  ")
}

// trustedRoot is where a chain starts: / on a host build.
func trustedRoot() string {
	if buildmode.FakeHW {
		if r := os.Getenv(EnvTestTrustedRoot); r != "" && filepath.IsAbs(r) {
			return filepath.Clean(r)
		}
	}
	return "/"
}

// ownerMode reads fi's owner and mode bits.
func ownerMode(fi fs.FileInfo) (uid uint32, perm fs.FileMode) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid, fi.Mode().Perm()
	}
	return ^uint32(0), fi.Mode().Perm()
}

// rootOnly says what is wrong with fi (a directory or file) that someone but
// root could change: another owner, or a group or other write bit. "" when
// nothing is.
func rootOnly(fi fs.FileInfo) string {
	uid, perm := ownerMode(fi)
	switch {
	case uid != 0:
		return fmt.Sprintf("owned by uid %d, not root", uid)
	case perm&0o022 != 0:
		return fmt.Sprintf("mode %04o is writable by group or other (chmod go-w)", octalMode(fi.Mode()))
	}
	return ""
}

// octalMode is m as chmod writes it: 2775 for root:staff's /usr/local/lib.
func octalMode(m fs.FileMode) uint32 {
	bits := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return bits
}

// CheckRootChain checks every existing directory from / (or the test root)
// down to each of dirs: each must be root's and closed to group and other
// writes, since anyone who could change one could swap what lies below it
// for their own. A symlink on the way must be root's too, and the chain goes
// on where it points. A component that does not exist ends its chain: the
// helper creates it (0755, root's).
func CheckRootChain(dirs ...string) []Problem {
	var probs []Problem
	seen := map[string]bool{}
	for _, d := range dirs {
		probs = append(probs, checkChain(d, seen, 0)...)
	}
	return probs
}

func checkChain(dir string, seen map[string]bool, depth int) []Problem {
	if depth > 8 {
		return []Problem{{dir, "too many symlinks on the way"}}
	}
	dir = filepath.Clean(dir)
	if !filepath.IsAbs(dir) {
		return []Problem{{dir, "not an absolute path"}}
	}
	root := trustedRoot()
	var probs []Problem
	// The components from the root down, root included.
	var path string
	rest := dir
	if root != "/" && (dir == root || strings.HasPrefix(dir, root+"/")) {
		path, rest = root, strings.TrimPrefix(dir, root)
	} else {
		path = "/"
	}
	parts := append([]string{""}, strings.Split(strings.Trim(rest, "/"), "/")...)
	for i, part := range parts {
		if part != "" {
			path = filepath.Join(path, part)
		} else if i > 0 {
			continue
		}
		if seen[path] {
			continue
		}
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return probs
		}
		if err != nil {
			return append(probs, Problem{path, err.Error()})
		}
		seen[path] = true
		if what := rootOnly(fi); what != "" && fi.Mode()&fs.ModeSymlink == 0 {
			probs = append(probs, Problem{path, what})
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if uid, _ := ownerMode(fi); uid != 0 {
				probs = append(probs, Problem{path, fmt.Sprintf("a symlink owned by uid %d, not root", uid)})
			}
			target, err := filepath.EvalSymlinks(path)
			if err != nil {
				return append(probs, Problem{path, err.Error()})
			}
			below := filepath.Join(append([]string{target}, parts[i+1:]...)...)
			return append(probs, checkChain(below, seen, depth+1)...)
		case !fi.IsDir():
			return append(probs, Problem{path, fmt.Sprintf("not a directory (%s)", fi.Mode().Type())})
		}
	}
	return probs
}

// CheckConfigFile checks config.toml as the helper reads it: a regular file
// root owns that no one else can write, in directories only root can write,
// because it decides what root does for the node.
func CheckConfigFile(path string) []Problem {
	abs, err := filepath.Abs(path)
	if err != nil {
		return []Problem{{path, err.Error()}}
	}
	probs := CheckRootChain(filepath.Dir(abs))
	fi, err := os.Lstat(abs)
	switch {
	case err != nil:
		return append(probs, Problem{abs, err.Error()})
	case !fi.Mode().IsRegular():
		return append(probs, Problem{abs, fmt.Sprintf("not a regular file (%s)", fi.Mode().Type())})
	}
	if what := rootOnly(fi); what != "" {
		probs = append(probs, Problem{abs, what + "; the config decides what root does for the node, so only root may write it"})
	}
	return probs
}

// CheckSocketDir checks the directory the helper's socket goes in: root's and
// closed to group and other writes, so the node cannot redirect root's work
// on the socket path with a symlink. A missing one is a problem too: the
// unit's RuntimeDirectory makes it.
func CheckSocketDir(socket string) []Problem {
	dir := filepath.Dir(socket)
	fi, err := os.Lstat(dir)
	switch {
	case err != nil:
		return []Problem{{dir, err.Error() + " (bcd-helper.service's RuntimeDirectory=bcd-helper makes it)"}}
	case !fi.IsDir():
		return []Problem{{dir, fmt.Sprintf("the socket's directory is not a directory (%s)", fi.Mode().Type())}}
	}
	if what := rootOnly(fi); what != "" {
		return []Problem{{dir, "the socket's directory: " + what}}
	}
	return nil
}

// StartupProblems is everything bcd helper checks before it starts, in the
// order it checks them: config.toml, the socket's directory, and as root the
// chains to the slots directory, the socket's directory and the entrypoint's
// directory. bcd doctor reports each as a failed helper check.
func StartupProblems(c *config.Config, configPath string) []Problem {
	if c.Helper == nil {
		return []Problem{{configPath, "has no [helper] section; bcd helper runs only beside a bcd node configured for it"}}
	}
	probs := CheckConfigFile(configPath)
	sock := SocketPath(c)
	probs = append(probs, CheckSocketDir(sock)...)
	if os.Geteuid() == 0 {
		probs = append(probs, CheckRootChain(c.SlotsDir(), filepath.Dir(sock), filepath.Dir(Entrypoint(c)))...)
	}
	return dedupe(probs)
}

func dedupe(probs []Problem) []Problem {
	seen := map[Problem]bool{}
	out := probs[:0]
	for _, p := range probs {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// SocketPath is [helper] socket or its default.
func SocketPath(c *config.Config) string {
	if c.Helper != nil && c.Helper.Socket != "" {
		return c.Helper.Socket
	}
	return config.DefaultHelperSocket
}

// UserName is [helper] user or its default.
func UserName(c *config.Config) string {
	if c.Helper != nil && c.Helper.User != "" {
		return c.Helper.User
	}
	return config.DefaultHelperUser
}

// Entrypoint is [update] entrypoint or its default.
func Entrypoint(c *config.Config) string {
	if u := c.UpdateOrDefault(); u.Entrypoint != "" {
		return u.Entrypoint
	}
	return config.DefaultEntrypoint
}
