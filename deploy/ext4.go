package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// extFS is an ext2/3/4 filesystem at a byte offset of a disk or image, reached with
// debugfs and never mounted. go-diskfs is not used for ext4: measured here, it
// corrupts an indexed (htree) directory when it writes into one, as a real /etc is.
type extFS struct {
	dev    string
	offset int64
}

// spec is the "device?offset=N" name e2fsprogs' unix I/O manager takes.
func (e *extFS) spec() string { return fmt.Sprintf("%s?offset=%d", e.dev, e.offset) }

// entryKind is what a name in a directory is.
type entryKind int

const (
	kindMissing entryKind = iota
	kindDir
	kindFile
	kindSymlink
	kindOther
)

func (k entryKind) String() string {
	return [...]string{"missing", "directory", "regular file", "symbolic link", "special file"}[k]
}

func modeKind(mode uint32) entryKind {
	switch mode & 0o170000 {
	case 0o040000:
		return kindDir
	case 0o100000:
		return kindFile
	case 0o120000:
		return kindSymlink
	}
	return kindOther
}

// debugfsQuote quotes an argument for debugfs's command parser. Paths reaching here
// passed protocol.ValidDeployPath or are our own temp files, checked here again.
func debugfsQuote(s string) (string, error) {
	if strings.ContainsAny(s, "\"\\\n\r\x00") {
		return "", fmt.Errorf("path %q cannot be passed to debugfs", s)
	}
	return `"` + s + `"`, nil
}

// debugfs runs a command file. debugfs exits 0 even when a command fails, so
// every line it writes to standard error, but its banner, is a failure.
func (e *extFS) debugfs(ctx context.Context, tmp string, write bool, cmds []string) ([]byte, error) {
	f, err := os.CreateTemp(tmp, "debugfs-*.cmd")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(strings.Join(cmds, "\n") + "\n"); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	args := []string{"-f", f.Name(), e.spec()}
	if write {
		args = append([]string{"-w"}, args...)
	}
	out, stderr, err := runTool(ctx, "debugfs", nil, args...)
	if err != nil {
		return nil, err
	}
	if bad := debugfsErrors(stderr); bad != "" {
		return out, fmt.Errorf("debugfs: %s", bad)
	}
	return out, nil
}

func debugfsErrors(stderr []byte) string {
	var bad []string
	sc := bufio.NewScanner(bytes.NewReader(stderr))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "debugfs ") && strings.HasSuffix(line, ")") {
			continue
		}
		bad = append(bad, line)
	}
	return firstLines(strings.Join(bad, "\n"), 5)
}

// dirEntry is one line of debugfs's ls -p.
type dirEntry struct {
	name     string
	mode     uint32
	uid, gid int
}

// parseLsP reads the output of debugfs commands "ls -p DIR" run from a command
// file: each "debugfs: ls -p DIR" echo line starts DIR's entries, one a line as
// /inode/mode/uid/gid/name/size/.
func parseLsP(out []byte) map[string][]dirEntry {
	res := map[string][]dirEntry{}
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "debugfs: ls -p "); ok {
			cur = strings.Trim(rest, `"`)
			res[cur] = nil
			continue
		}
		if cur == "" || !strings.HasPrefix(line, "/") {
			continue
		}
		f := strings.Split(line[1:], "/")
		if len(f) < 6 {
			continue
		}
		mode, err1 := strconv.ParseUint(f[1], 8, 32)
		uid, err2 := strconv.Atoi(f[2])
		gid, err3 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil || err3 != nil || f[4] == "." || f[4] == ".." || f[4] == "" {
			continue
		}
		res[cur] = append(res[cur], dirEntry{name: f[4], mode: uint32(mode), uid: uid, gid: gid})
	}
	return res
}

// lookup finds what each path is, listing directories a level at a time from the
// root so that every ls names a directory known to exist and debugfs has no reason
// to complain.
func (e *extFS) lookup(ctx context.Context, tmp string, paths []string) (map[string]entryKind, error) {
	kinds := map[string]entryKind{"/": kindDir}
	// Directories whose listing answers the question, by depth.
	need := map[string]bool{}
	for _, p := range paths {
		for d := path.Dir(p); ; d = path.Dir(d) {
			need[d] = true
			if d == "/" {
				break
			}
		}
	}
	byDepth := map[int][]string{}
	maxDepth := 0
	for d := range need {
		n := depth(d)
		byDepth[n] = append(byDepth[n], d)
		maxDepth = max(maxDepth, n)
	}
	for level := 0; level <= maxDepth; level++ {
		var dirs, cmds []string
		for _, d := range byDepth[level] {
			if kinds[d] != kindDir {
				continue
			}
			q, err := debugfsQuote(d)
			if err != nil {
				return nil, err
			}
			dirs = append(dirs, d)
			cmds = append(cmds, "ls -p "+q)
		}
		if len(cmds) == 0 {
			continue
		}
		sort.Strings(cmds)
		out, err := e.debugfs(ctx, tmp, false, cmds)
		if err != nil {
			return nil, err
		}
		listed := parseLsP(out)
		for _, d := range dirs {
			for _, ent := range listed[d] {
				kinds[path.Join(d, ent.name)] = modeKind(ent.mode)
			}
		}
	}
	return kinds, nil
}

func depth(p string) int {
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// exists reports whether path names anything.
func (e *extFS) exists(ctx context.Context, tmp, p string) (bool, error) {
	kinds, err := e.lookup(ctx, tmp, []string{p})
	if err != nil {
		return false, err
	}
	return kinds[p] != kindMissing, nil
}

// extWrite is one file to write: its content is already in a private temp file.
type extWrite struct {
	src, dest string
	// link, when set, makes dest a symbolic link to link (src unused).
	link     string
	mode     uint32
	uid, gid int
}

// write writes files into the filesystem in one debugfs session: missing
// directories are created (0755, root), an existing file or symlink at a path is
// removed first (debugfs's write does not overwrite), and mode and owner are set
// on the new inode. A directory in the way, or a symlink or file where a directory
// is needed, is an error rather than something to follow or replace.
func (e *extFS) write(ctx context.Context, tmp string, files []extWrite) error {
	var paths []string
	for _, f := range files {
		paths = append(paths, f.dest)
	}
	kinds, err := e.lookup(ctx, tmp, paths)
	if err != nil {
		return err
	}
	var cmds []string
	made := map[string]bool{}
	for _, f := range files {
		var dirs []string
		for d := path.Dir(f.dest); d != "/"; d = path.Dir(d) {
			dirs = append([]string{d}, dirs...)
		}
		for _, d := range dirs {
			switch k := kinds[d]; {
			case k == kindDir || made[d]:
			case k == kindMissing:
				q, err := debugfsQuote(d)
				if err != nil {
					return err
				}
				cmds = append(cmds, "mkdir "+q, "sif "+q+" mode 040755", "sif "+q+" uid 0", "sif "+q+" gid 0")
				made[d] = true
			default:
				return fmt.Errorf("%s: %s is a %s, not a directory", f.dest, d, k)
			}
		}
		q, err := debugfsQuote(f.dest)
		if err != nil {
			return err
		}
		qs, err := debugfsQuote(f.src)
		if err != nil && f.link == "" {
			return err
		}
		switch k := kinds[f.dest]; k {
		case kindMissing:
		case kindFile, kindSymlink:
			cmds = append(cmds, "rm "+q)
		default:
			return fmt.Errorf("%s is a %s; refusing to replace it with a file", f.dest, k)
		}
		kinds[f.dest] = kindMissing
		if f.link != "" {
			ql, err := debugfsQuote(f.link)
			if err != nil {
				return err
			}
			cmds = append(cmds, "symlink "+q+" "+ql)
			continue
		}
		cmds = append(cmds, "write "+qs+" "+q,
			fmt.Sprintf("sif %s mode 0%o", q, 0o100000|f.mode),
			fmt.Sprintf("sif %s uid %d", q, f.uid),
			fmt.Sprintf("sif %s gid %d", q, f.gid))
	}
	_, err = e.debugfs(ctx, tmp, true, cmds)
	return err
}

// listDir lists a directory; a missing one is empty.
func (e *extFS) listDir(ctx context.Context, tmp, dir string) ([]dirEntry, error) {
	kinds, err := e.lookup(ctx, tmp, []string{path.Join(dir, "x")})
	if err != nil {
		return nil, err
	}
	if kinds[dir] != kindDir {
		return nil, nil
	}
	q, err := debugfsQuote(dir)
	if err != nil {
		return nil, err
	}
	out, err := e.debugfs(ctx, tmp, false, []string{"ls -p " + q})
	if err != nil {
		return nil, err
	}
	return parseLsP(out)[dir], nil
}

// dump copies a regular file out of the filesystem into local.
func (e *extFS) dump(ctx context.Context, tmp, p, local string) error {
	q, err := debugfsQuote(p)
	if err != nil {
		return err
	}
	ql, err := debugfsQuote(local)
	if err != nil {
		return err
	}
	_, err = e.debugfs(ctx, tmp, false, []string{"dump " + q + " " + ql})
	return err
}

// readFile returns a small file's content (at most limit bytes).
func (e *extFS) readFile(ctx context.Context, tmp, p string, limit int64) ([]byte, error) {
	local := filepath.Join(tmp, "read-"+strconv.Itoa(int(nextSeq())))
	defer os.Remove(local)
	if err := e.dump(ctx, tmp, p, local); err != nil {
		return nil, err
	}
	return readLimited(local, limit)
}

// readlink returns a symlink's target: debugfs prints a fast link's in stat, and a
// slow link's target is its data.
func (e *extFS) readlink(ctx context.Context, tmp, p string) (string, error) {
	q, err := debugfsQuote(p)
	if err != nil {
		return "", err
	}
	out, err := e.debugfs(ctx, tmp, false, []string{"stat " + q})
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "Fast link dest: "); ok {
			return strings.Trim(rest, `"`), nil
		}
	}
	b, err := e.readFile(ctx, tmp, p, 4096)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// fsck runs e2fsck -fn: a check that changes nothing and fails on any problem.
func (e *extFS) fsck(ctx context.Context) error {
	out, stderr, err := runTool(ctx, "e2fsck", nil, "-fn", e.spec())
	if err != nil {
		return fmt.Errorf("e2fsck -fn: %w: %s", err, firstLines(string(out)+string(stderr), 8))
	}
	return nil
}
