package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"strings"
	"sync/atomic"
)

// fatFS is a FAT filesystem (the ESP) at a byte offset, reached with mtools, which
// unlike go-diskfs also handles FAT12 and FAT16.
type fatFS struct {
	dev    string
	offset int64
}

// mtoolsEnv: mtools refuses a FAT32 of fewer than 65,525 clusters, which
// mkfs.vfat makes for small ESPs and firmware reads happily; and no user's
// configuration applies.
var mtoolsEnv = []string{"MTOOLS_SKIP_CHECK=1", "MTOOLSRC=/dev/null"}

func (f *fatFS) image() string { return fmt.Sprintf("%s@@%d", f.dev, f.offset) }

func (f *fatFS) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	out, _, err := runTool(ctx, tool, mtoolsEnv, append([]string{"-i", f.image()}, args...)...)
	return out, err
}

// list returns a directory's entries by lowercased name (FAT names are
// case-insensitive), or ok false when it does not exist.
func (f *fatFS) list(ctx context.Context, dir string) (map[string]entryKind, bool, error) {
	target := "::" + strings.TrimSuffix(dir, "/") + "/"
	out, err := f.run(ctx, "mdir", "-a", "-b", target)
	if err != nil {
		// mdir fails for a missing directory; tell that from a broken filesystem by
		// checking the root, which always exists.
		if dir != "/" {
			if _, ok, rerr := f.list(ctx, "/"); rerr == nil && ok {
				return nil, false, nil
			}
		}
		return nil, false, err
	}
	return parseMdir(out, dir), true, nil
}

// parseMdir reads mdir -b output: one full path a line, "::/EFI/BOOT/" with a
// trailing slash for a directory.
func parseMdir(out []byte, dir string) map[string]entryKind {
	prefix := "::" + strings.TrimSuffix(dir, "/") + "/"
	res := map[string]entryKind{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok || rest == "" {
			continue
		}
		kind := kindFile
		if strings.HasSuffix(rest, "/") {
			kind, rest = kindDir, strings.TrimSuffix(rest, "/")
		}
		if rest == "" || strings.Contains(rest, "/") || rest == "." || rest == ".." {
			continue
		}
		res[strings.ToLower(rest)] = kind
	}
	return res
}

// write copies files in, creating missing directories and overwriting files.
func (f *fatFS) write(ctx context.Context, files []extWrite) error {
	listed := map[string]map[string]entryKind{}
	kindOf := func(p string) (entryKind, error) {
		dir := path.Dir(p)
		l, ok := listed[dir]
		if !ok {
			var exists bool
			var err error
			l, exists, err = f.list(ctx, dir)
			if err != nil {
				return kindMissing, err
			}
			if !exists {
				l = map[string]entryKind{}
			}
			listed[dir] = l
		}
		return l[strings.ToLower(path.Base(p))], nil
	}
	for _, w := range files {
		var dirs []string
		for d := path.Dir(w.dest); d != "/"; d = path.Dir(d) {
			dirs = append([]string{d}, dirs...)
		}
		for _, d := range dirs {
			k, err := kindOf(d)
			if err != nil {
				return err
			}
			switch k {
			case kindDir:
			case kindMissing:
				if _, err := f.run(ctx, "mmd", "::"+d); err != nil {
					return err
				}
				listed[path.Dir(d)][strings.ToLower(path.Base(d))] = kindDir
				listed[d] = map[string]entryKind{}
			default:
				return fmt.Errorf("%s: %s is a file, not a directory", w.dest, d)
			}
		}
		k, err := kindOf(w.dest)
		if err != nil {
			return err
		}
		if k == kindDir {
			return fmt.Errorf("%s is a directory; refusing to replace it with a file", w.dest)
		}
		if _, err := f.run(ctx, "mcopy", "-o", w.src, "::"+w.dest); err != nil {
			return err
		}
		listed[path.Dir(w.dest)][strings.ToLower(path.Base(w.dest))] = kindFile
	}
	return nil
}

// exists reports whether a file is there.
func (f *fatFS) exists(ctx context.Context, p string) (bool, error) {
	l, ok, err := f.list(ctx, path.Dir(p))
	if err != nil || !ok {
		return false, err
	}
	return l[strings.ToLower(path.Base(p))] == kindFile, nil
}

// dump copies a file out into local.
func (f *fatFS) dump(ctx context.Context, p, local string) error {
	_, err := f.run(ctx, "mcopy", "-n", "::"+p, local)
	return err
}

// readFile returns a small file's content.
func (f *fatFS) readFile(ctx context.Context, tmp, p string, limit int64) ([]byte, error) {
	local := path.Join(tmp, fmt.Sprintf("read-%d", nextSeq()))
	defer os.Remove(local)
	if err := f.dump(ctx, p, local); err != nil {
		return nil, err
	}
	return readLimited(local, limit)
}

var seq atomic.Int64

func nextSeq() int64 { return seq.Add(1) }

func readLimited(p string, limit int64) ([]byte, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%d bytes, more than the %d expected", fi.Size(), limit)
	}
	return os.ReadFile(p)
}
