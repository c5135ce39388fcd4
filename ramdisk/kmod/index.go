package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// maxIndexFile bounds each index file: Debian's modules.alias is about 1.5 MB.
const maxIndexFile = 64 << 20

// Index is what depmod wrote about one kernel's modules: where each is
// (modules.dep), which hardware each drives (modules.alias), what must load around
// it without being a symbol dependency (modules.softdep), and what is built in.
type Index struct {
	// Dir is /lib/modules/<release>.
	Dir string

	mods     map[string]*module
	aliases  []alias
	literal  map[string][]string // aliases without glob characters, by alias
	softdeps map[string]softdep
	builtin  map[string]bool
}

type module struct {
	name string
	path string   // relative to Dir, as modules.dep has it
	deps []string // names, as modules.dep lists them
}

type alias struct {
	pattern, module string
}

type softdep struct {
	pre, post []string // names or aliases
}

// Extra softdeps the ramdisk applies on top of modules.softdep. vfat mounts with
// the default codepage and iocharset, whose nls modules the kernel would otherwise
// ask a /sbin/modprobe for that a ramdisk may not have.
var extraSoftdeps = map[string]softdep{
	"vfat": {pre: []string{"nls_cp437", "nls_ascii"}},
	"ext4": {pre: []string{"crc32c"}},
}

// Normalize is a module's name as the kernel knows it: the file name without .ko
// and compression suffix, with - read as _ (modules.dep and the kernel disagree on
// names such as crc32c-intel).
func Normalize(name string) string {
	name = path.Base(name)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		name = strings.TrimSuffix(name, ext)
	}
	name = strings.TrimSuffix(name, ".ko")
	return strings.ReplaceAll(name, "-", "_")
}

// LoadIndex reads modules.dep, modules.alias, and (when present) modules.softdep
// and modules.builtin from dir.
func LoadIndex(dir string) (*Index, error) {
	ix := newIndex(dir)
	for _, f := range []struct {
		name     string
		optional bool
		parse    func(io.Reader) error
	}{
		{"modules.dep", false, ix.parseDep},
		{"modules.alias", false, ix.parseAlias},
		{"modules.softdep", true, ix.parseSoftdep},
		{"modules.builtin", true, ix.parseBuiltin},
	} {
		p := filepath.Join(dir, f.name)
		fh, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) && f.optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kernel modules: %w", err)
		}
		err = f.parse(io.LimitReader(fh, maxIndexFile))
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("kernel modules: %s: %w", p, err)
		}
	}
	return ix, nil
}

func newIndex(dir string) *Index {
	return &Index{Dir: dir, mods: map[string]*module{}, literal: map[string][]string{},
		softdeps: map[string]softdep{}, builtin: map[string]bool{}}
}

func lines(r io.Reader, fn func(n int, line string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// parseDep reads "kernel/x/a.ko: kernel/y/b.ko kernel/z/c.ko".
func (ix *Index) parseDep(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		file, deps, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(file) == "" {
			return fmt.Errorf("line %d: want \"module.ko: dependencies\"", n)
		}
		file = strings.TrimSpace(file)
		m := &module{name: Normalize(file), path: file}
		for _, d := range strings.Fields(deps) {
			m.deps = append(m.deps, Normalize(d))
		}
		ix.mods[m.name] = m
		return nil
	})
}

// parseAlias reads "alias PATTERN MODULE".
func (ix *Index) parseAlias(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "alias" {
			return fmt.Errorf("line %d: want \"alias PATTERN MODULE\"", n)
		}
		a := alias{pattern: f[1], module: Normalize(f[2])}
		if strings.ContainsAny(a.pattern, "*?[\\") {
			ix.aliases = append(ix.aliases, a)
		} else {
			ix.literal[a.pattern] = append(ix.literal[a.pattern], a.module)
		}
		return nil
	})
}

// parseSoftdep reads "softdep MODULE pre: A B post: C".
func (ix *Index) parseSoftdep(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "softdep" {
			return fmt.Errorf("line %d: want \"softdep MODULE pre: ... post: ...\"", n)
		}
		name := Normalize(f[1])
		sd := ix.softdeps[name]
		var dst *[]string
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				dst = &sd.pre
			case "post:":
				dst = &sd.post
			default:
				// kmod ignores words before pre: or post: (Debian's file has
				// "softdep cifs gcm" from a module that wrote no keyword).
				if dst != nil {
					*dst = append(*dst, w)
				}
			}
		}
		ix.softdeps[name] = sd
		return nil
	})
}

// parseBuiltin reads "kernel/fs/nls/nls_base.ko".
func (ix *Index) parseBuiltin(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		ix.builtin[Normalize(line)] = true
		return nil
	})
}

// Path is where module name is, and whether the index has it.
func (ix *Index) Path(name string) (string, bool) {
	m, ok := ix.mods[Normalize(name)]
	if !ok {
		return "", false
	}
	return filepath.Join(ix.Dir, m.path), true
}

// Builtin reports whether name is built into the kernel.
func (ix *Index) Builtin(name string) bool { return ix.builtin[Normalize(name)] }

// Match returns the modules whose alias patterns match a device's modalias, sorted.
func (ix *Index) Match(modalias string) []string {
	set := map[string]bool{}
	for _, m := range ix.literal[modalias] {
		set[m] = true
	}
	for _, a := range ix.aliases {
		if Glob(a.pattern, modalias) {
			set[a.module] = true
		}
	}
	return sortedKeys(set)
}

// Lookup resolves what a softdep or an operator names: a module, a built-in (no
// module to load), or else every module with a matching alias, as modprobe does.
func (ix *Index) Lookup(name string) []string {
	n := Normalize(name)
	if _, ok := ix.mods[n]; ok {
		return []string{n}
	}
	if ix.builtin[n] {
		return nil
	}
	if m := ix.Match(name); len(m) > 0 {
		return m
	}
	return ix.Match(strings.ReplaceAll(name, "-", "_"))
}

// Order returns names with everything they need, in an order that loads each
// module after its dependencies and pre-softdeps and before its post-softdeps.
// Built-in modules and names the index does not know are left out; a cycle, which
// depmod would have refused, is broken where it is found.
func (ix *Index) Order(names []string) []string {
	var out []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string)
	visitAll := func(list []string) {
		for _, s := range list {
			for _, m := range ix.Lookup(s) {
				visit(m)
			}
		}
	}
	visit = func(n string) {
		if state[n] != 0 {
			return
		}
		m, ok := ix.mods[n]
		if !ok {
			return
		}
		state[n] = 1
		sd := ix.softdeps[n]
		visitAll(sd.pre)
		visitAll(extraSoftdeps[n].pre)
		// modules.dep lists a module's dependencies so that the last loads
		// first, which is the order modprobe inserts them in.
		for i := len(m.deps) - 1; i >= 0; i-- {
			visit(m.deps[i])
		}
		state[n] = 2
		out = append(out, n)
		visitAll(sd.post)
		visitAll(extraSoftdeps[n].post)
	}
	for _, n := range names {
		visit(Normalize(n))
	}
	return out
}

// Deps are module name's symbol dependencies, as modules.dep lists them.
func (ix *Index) Deps(name string) []string {
	if m, ok := ix.mods[Normalize(name)]; ok {
		return append([]string(nil), m.deps...)
	}
	return nil
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Glob reports whether s matches the fnmatch(3) pattern p (flags 0): * matches any
// run of bytes, / included, ? any one byte, [...] a class with ranges and ! or ^
// negation, and \ escapes the next byte. It backtracks only to the last *, so it
// runs in time proportional to len(p)·len(s) whatever the pattern.
func Glob(p, s string) bool {
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(s) {
		if pi < len(p) {
			switch c := p[pi]; c {
			case '*':
				starP, starS = pi, si
				pi++
				continue
			case '?':
				pi++
				si++
				continue
			case '[':
				if ok, next, valid := matchClass(p, pi, s[si]); valid {
					if ok {
						pi, si = next, si+1
						continue
					}
				} else if s[si] == '[' { // an unterminated [ is a literal
					pi, si = pi+1, si+1
					continue
				}
			case '\\':
				if pi+1 < len(p) && p[pi+1] == s[si] {
					pi, si = pi+2, si+1
					continue
				}
				if pi+1 == len(p) && s[si] == '\\' {
					pi, si = pi+1, si+1
					continue
				}
			default:
				if c == s[si] {
					pi, si = pi+1, si+1
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starS++
		pi, si = starP+1, starS
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// matchClass matches c against the class starting at p[i] == '['. valid is false
// when the class is not terminated.
func matchClass(p string, i int, c byte) (match bool, next int, valid bool) {
	j := i + 1
	negate := false
	if j < len(p) && (p[j] == '!' || p[j] == '^') {
		negate = true
		j++
	}
	first := true
	for j < len(p) {
		if p[j] == ']' && !first {
			return match != negate, j + 1, true
		}
		first = false
		lo := p[j]
		if lo == '\\' && j+1 < len(p) {
			j++
			lo = p[j]
		}
		j++
		hi := lo
		if j+1 < len(p) && p[j] == '-' && p[j+1] != ']' {
			hi = p[j+1]
			if hi == '\\' && j+2 < len(p) {
				hi = p[j+2]
				j++
			}
			j += 2
		}
		if lo <= c && c <= hi {
			match = true
		}
	}
	return false, 0, false
}
