package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/better-compute/bcd/protocol"
)

// bootFS reads files of the root filesystem or the ESP alike.
type bootFS interface {
	readFile(ctx context.Context, tmp, p string, limit int64) ([]byte, error)
	dumpTo(ctx context.Context, tmp, p, local string) error
	isFile(ctx context.Context, tmp, p string) (bool, error)
	list(ctx context.Context, tmp, dir string) ([]string, error)
	name() string
}

type rootBoot struct{ fs *extFS }

func (r rootBoot) name() string { return protocol.FSRoot }
func (r rootBoot) readFile(ctx context.Context, tmp, p string, limit int64) ([]byte, error) {
	rp, err := r.resolve(ctx, tmp, p)
	if err != nil {
		return nil, err
	}
	return r.fs.readFile(ctx, tmp, rp, limit)
}
func (r rootBoot) dumpTo(ctx context.Context, tmp, p, local string) error {
	rp, err := r.resolve(ctx, tmp, p)
	if err != nil {
		return err
	}
	return r.fs.dump(ctx, tmp, rp, local)
}
func (r rootBoot) isFile(ctx context.Context, tmp, p string) (bool, error) {
	_, err := r.resolve(ctx, tmp, p)
	if err == errNotFound {
		return false, nil
	}
	return err == nil, err
}
func (r rootBoot) list(ctx context.Context, tmp, dir string) ([]string, error) {
	ents, err := r.fs.listDir(ctx, tmp, dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.name)
	}
	return names, err
}

var errNotFound = fmt.Errorf("not found")

// resolve follows symlinks at the end of p (Debian's /vmlinuz -> boot/vmlinuz-…),
// up to 8 of them, relative to the link's directory or to the filesystem's root,
// and returns the path of the regular file they lead to. debugfs itself does not
// follow a final symlink.
func (r rootBoot) resolve(ctx context.Context, tmp, p string) (string, error) {
	for hop := 0; hop < 8; hop++ {
		kinds, err := r.fs.lookup(ctx, tmp, []string{p})
		if err != nil {
			return "", err
		}
		switch kinds[p] {
		case kindFile:
			return p, nil
		case kindMissing:
			return "", errNotFound
		case kindSymlink:
			target, err := r.fs.readlink(ctx, tmp, p)
			if err != nil {
				return "", err
			}
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(p), target)
			}
			p = path.Clean(target)
			if protocol.ValidDeployPath(p) != nil {
				return "", fmt.Errorf("symlink to %q", target)
			}
		default:
			return "", fmt.Errorf("%s is a %s", p, kinds[p])
		}
	}
	return "", fmt.Errorf("%s: too many symbolic links", p)
}

type espBoot struct{ fs *fatFS }

func (e espBoot) name() string { return protocol.FSESP }
func (e espBoot) readFile(ctx context.Context, tmp, p string, limit int64) ([]byte, error) {
	return e.fs.readFile(ctx, tmp, p, limit)
}
func (e espBoot) dumpTo(ctx context.Context, tmp, p, local string) error {
	return e.fs.dump(ctx, p, local)
}
func (e espBoot) isFile(ctx context.Context, tmp, p string) (bool, error) { return e.fs.exists(ctx, p) }
func (e espBoot) list(ctx context.Context, tmp, dir string) ([]string, error) {
	l, ok, err := e.fs.list(ctx, dir)
	if err != nil || !ok {
		return nil, err
	}
	var names []string
	for n, k := range l {
		if k == kindFile {
			names = append(names, n)
		}
	}
	return names, nil
}

// bootChoice is the kernel to kexec.
type bootChoice struct {
	fs      bootFS
	kernel  string
	initrds []string
	cmdline string
	source  string
}

const (
	maxKernelSize = 256 << 20
	maxSmallFile  = 64 << 10
)

// findBoot picks the kernel, initrd and command line to kexec. In order:
//
//  1. after.kernel (and after.initrd) in after.fs, when given;
//  2. a Boot Loader Specification entry on the ESP (/loader/entries/*.conf): the
//     one loader.conf's default names (a glob), else the highest version; its
//     linux, initrd lines (several are concatenated) and options;
//  3. in the root filesystem, /boot/vmlinuz and /boot/initrd.img, then /vmlinuz
//     and /initrd.img (Debian's symlinks), then the highest /boot/vmlinuz-VERSION
//     with /boot/initrd.img-VERSION or /boot/initramfs-VERSION.img.
//
// The command line is after.cmdline, else the BLS entry's options, else the root
// filesystem's /boot/bcd-cmdline or /etc/kernel/cmdline (first line), else
// root=PARTUUID=<root> ro plus the ramdisk's own console= parameters.
// Unified kernel images (BLS "efi" lines) and GRUB configurations are not read.
func (d *Deployer) findBoot(ctx context.Context, in *installed, after After, tmp string) (bootChoice, error) {
	var root, esp bootFS
	if in.root != nil {
		root = rootBoot{in.root}
	}
	if in.esp != nil {
		esp = espBoot{in.esp}
	}
	var c bootChoice
	switch {
	case after.Kernel != "":
		c.fs = root
		if after.FS == protocol.FSESP {
			c.fs = esp
		}
		if c.fs == nil {
			if after.FS == protocol.FSESP {
				return c, fmt.Errorf("after.kernel on the ESP: %v", in.espErr)
			}
			return c, fmt.Errorf("after.kernel in the root filesystem: %v", in.rootErr)
		}
		c.kernel, c.source = after.Kernel, "params"
		if after.Initrd != "" {
			c.initrds = []string{after.Initrd}
		}
	default:
		found := false
		if esp != nil {
			e, ok, err := findBLS(ctx, esp, tmp)
			if err != nil {
				return c, fmt.Errorf("ESP loader entries: %w", err)
			}
			if ok {
				c = bootChoice{fs: esp, kernel: e.linux, initrds: e.initrd, cmdline: e.options, source: "esp:/loader/entries/" + e.name}
				found = true
			}
		}
		if !found && root != nil {
			var err error
			c, found, err = findRootKernel(ctx, root, tmp)
			if err != nil {
				return c, err
			}
		}
		if !found {
			return c, fmt.Errorf("no kernel found: no ESP loader entry, no /boot/vmlinuz, /vmlinuz or /boot/vmlinuz-* in the root filesystem (%v)", in.rootErr)
		}
	}
	switch {
	case after.Cmdline != "":
		c.cmdline = after.Cmdline
	case c.cmdline != "":
	default:
		if root != nil {
			for _, p := range []string{"/boot/bcd-cmdline", "/etc/kernel/cmdline"} {
				if ok, _ := root.isFile(ctx, tmp, p); !ok {
					continue
				}
				b, err := root.readFile(ctx, tmp, p, maxSmallFile)
				if err != nil {
					return c, fmt.Errorf("%s: %w", p, err)
				}
				if line := firstLine(b); line != "" {
					c.cmdline = line
					break
				}
			}
		}
		if c.cmdline == "" {
			if in.root == nil {
				return c, fmt.Errorf("no command line given or found, and no root partition to name")
			}
			c.cmdline = "root=PARTUUID=" + in.rootPart.PartUUID(in.table) + " ro"
			for _, p := range d.consoleParams() {
				c.cmdline += " " + p
			}
		}
	}
	return c, nil
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

// consoleParams are the running kernel's console= parameters: the machine's serial
// console is the same after the kexec.
func (d *Deployer) consoleParams() []string {
	p := d.ProcCmdline
	if p == "" {
		p = "/proc/cmdline"
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	var out []string
	for _, f := range strings.Fields(string(b)) {
		if strings.HasPrefix(f, "console=") {
			out = append(out, f)
		}
	}
	return out
}

func findRootKernel(ctx context.Context, root bootFS, tmp string) (bootChoice, bool, error) {
	for _, pair := range [][2]string{{"/boot/vmlinuz", "/boot/initrd.img"}, {"/vmlinuz", "/initrd.img"}} {
		ok, err := root.isFile(ctx, tmp, pair[0])
		if err != nil {
			return bootChoice{}, false, fmt.Errorf("root %s: %w", pair[0], err)
		}
		if !ok {
			continue
		}
		c := bootChoice{fs: root, kernel: pair[0], source: "root:" + pair[0]}
		if ok, _ := root.isFile(ctx, tmp, pair[1]); ok {
			c.initrds = []string{pair[1]}
		}
		return c, true, nil
	}
	names, err := root.list(ctx, tmp, "/boot")
	if err != nil {
		return bootChoice{}, false, fmt.Errorf("root /boot: %w", err)
	}
	var versions []string
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
		if v, ok := strings.CutPrefix(n, "vmlinuz-"); ok && v != "" {
			versions = append(versions, v)
		}
	}
	if len(versions) == 0 {
		return bootChoice{}, false, nil
	}
	sort.Slice(versions, func(i, j int) bool { return versionLess(versions[j], versions[i]) })
	v := versions[0]
	c := bootChoice{fs: root, kernel: "/boot/vmlinuz-" + v, source: "root:/boot/vmlinuz-" + v}
	for _, n := range []string{"initrd.img-" + v, "initramfs-" + v + ".img"} {
		if have[n] {
			c.initrds = []string{"/boot/" + n}
			break
		}
	}
	return c, true, nil
}

// loadKernel reads the chosen kernel and initrd out of the written disk into the
// private temp directory and hands them to Machine.KexecLoad.
func (d *Deployer) loadKernel(ctx context.Context, in *installed, after After, tmp string, res *Result) error {
	c, err := d.findBoot(ctx, in, after, tmp)
	if err != nil {
		return failf(reasonKernel, "%v", err)
	}
	kpath := filepath.Join(tmp, "kernel")
	if err := c.fs.dumpTo(ctx, tmp, c.kernel, kpath); err != nil {
		return failf(reasonKernel, "read the kernel %s:%s: %v", c.fs.name(), c.kernel, err)
	}
	kf, err := os.Open(kpath)
	if err != nil {
		return failf(reasonKernel, "%v", err)
	}
	defer kf.Close()
	if fi, err := kf.Stat(); err != nil || fi.Size() == 0 || fi.Size() > maxKernelSize {
		return failf(reasonKernel, "the kernel %s:%s is empty or larger than %d bytes", c.fs.name(), c.kernel, maxKernelSize)
	}
	var initrd *os.File
	if len(c.initrds) > 0 {
		ipath := filepath.Join(tmp, "initrd")
		out, err := os.OpenFile(ipath, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return failf(reasonKernel, "%v", err)
		}
		// Concatenated initrds are what the kernel unpacks in turn (early microcode
		// first, as BLS lists them).
		for i, p := range c.initrds {
			part := filepath.Join(tmp, fmt.Sprintf("initrd-%d", i))
			if err := c.fs.dumpTo(ctx, tmp, p, part); err != nil {
				out.Close()
				return failf(reasonKernel, "read the initrd %s:%s: %v", c.fs.name(), p, err)
			}
			if err := appendFile(out, part); err != nil {
				out.Close()
				return failf(reasonKernel, "initrd: %v", err)
			}
		}
		if err := out.Close(); err != nil {
			return failf(reasonKernel, "initrd: %v", err)
		}
		if initrd, err = os.Open(ipath); err != nil {
			return failf(reasonKernel, "%v", err)
		}
		defer initrd.Close()
	}
	if err := d.machine().KexecLoad(kf, initrd, c.cmdline); err != nil {
		return failf(reasonKernel, "load %s:%s: %v", c.fs.name(), c.kernel, err)
	}
	res.Kernel = c.fs.name() + ":" + c.kernel
	if len(c.initrds) > 0 {
		res.Initrd = c.fs.name() + ":" + strings.Join(c.initrds, ",")
	}
	res.Cmdline, res.KernelSource = c.cmdline, c.source
	d.log().Info("deploy: kernel loaded", "kernel", res.Kernel, "initrd", res.Initrd, "source", c.source)
	return nil
}

func appendFile(out *os.File, p string) error {
	in, err := os.Open(p)
	if err != nil {
		return err
	}
	defer in.Close()
	defer os.Remove(p)
	_, err = io.Copy(out, in)
	return err
}

// Finish carries out a deploy's After: it jumps to the loaded kernel, reboots or
// powers off, and returns only on failure (or at once for none). The ramdisk calls
// it once it has reported the deploy's success.
func (d *Deployer) Finish(r Result) error {
	switch r.After {
	case protocol.AfterKexec:
		return d.machine().KexecExec()
	case protocol.AfterReboot:
		return d.machine().Reboot()
	case protocol.AfterPowerOff:
		return d.machine().PowerOff()
	}
	return nil
}

// blsEntry is a Boot Loader Specification type #1 entry.
type blsEntry struct {
	name, title, version, linux, efi string
	initrd                           []string
	options                          string
}

// parseBLSEntry reads a loader entry: "key value" lines, # comments. Paths must be
// clean absolute paths within the ESP.
func parseBLSEntry(name string, b []byte) (blsEntry, error) {
	e := blsEntry{name: name}
	var opts []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val := line, ""
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			key, val = line[:i], strings.TrimSpace(line[i+1:])
		}
		switch key {
		case "title":
			e.title = val
		case "version":
			e.version = val
		case "linux":
			e.linux = val
		case "initrd":
			e.initrd = append(e.initrd, strings.Fields(val)...)
		case "options":
			opts = append(opts, val)
		case "efi":
			e.efi = val
		}
	}
	if err := sc.Err(); err != nil {
		return e, fmt.Errorf("%s: %w", name, err)
	}
	e.options = strings.Join(opts, " ")
	if strings.ContainsAny(e.options, "\x00\r") || len(e.options) > 4096 {
		return e, fmt.Errorf("%s: options are not one command line", name)
	}
	if e.linux == "" {
		if e.efi != "" {
			return e, fmt.Errorf("%s: a unified kernel image (efi %s) cannot be kexec'd from here", name, e.efi)
		}
		return e, fmt.Errorf("%s: no linux line", name)
	}
	for _, p := range append([]string{e.linux}, e.initrd...) {
		if err := protocol.ValidDeployPath(p); err != nil {
			return e, fmt.Errorf("%s: %w", name, err)
		}
	}
	return e, nil
}

// loaderDefault returns loader.conf's default pattern, if any.
func loaderDefault(b []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "default" {
			return f[1]
		}
	}
	return ""
}

// pickBLS chooses the entry loader.conf's default matches (the highest such),
// else the highest of all, by version then file name.
func pickBLS(entries []blsEntry, def string) (blsEntry, bool) {
	if len(entries) == 0 {
		return blsEntry{}, false
	}
	sorted := append([]blsEntry(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.version != b.version {
			return versionLess(b.version, a.version)
		}
		return versionLess(b.name, a.name)
	})
	if def != "" {
		for _, e := range sorted {
			if ok, _ := path.Match(strings.ToLower(def), e.name); ok {
				return e, true
			}
			if ok, _ := path.Match(strings.ToLower(def), strings.TrimSuffix(e.name, ".conf")); ok {
				return e, true
			}
		}
	}
	return sorted[0], true
}

func findBLS(ctx context.Context, esp bootFS, tmp string) (blsEntry, bool, error) {
	names, err := esp.list(ctx, tmp, "/loader/entries")
	if err != nil {
		return blsEntry{}, false, err
	}
	var entries []blsEntry
	var errs []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".conf") {
			continue
		}
		b, err := esp.readFile(ctx, tmp, "/loader/entries/"+n, maxSmallFile)
		if err != nil {
			return blsEntry{}, false, err
		}
		e, err := parseBLSEntry(n, b)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		if len(errs) > 0 {
			return blsEntry{}, false, fmt.Errorf("no usable entry: %s", strings.Join(errs, "; "))
		}
		return blsEntry{}, false, nil
	}
	def := ""
	if ok, _ := esp.isFile(ctx, tmp, "/loader/loader.conf"); ok {
		if b, err := esp.readFile(ctx, tmp, "/loader/loader.conf", maxSmallFile); err == nil {
			def = loaderDefault(b)
		}
	}
	e, ok := pickBLS(entries, def)
	return e, ok, nil
}

// versionLess compares version strings the way sort -V roughly does: runs of
// digits by value, everything else byte by byte.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := isDigit(a[0]), isDigit(b[0])
		if da && db {
			na, ra := splitRun(a, true)
			nb, rb := splitRun(b, true)
			na2, nb2 := strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(na2) != len(nb2) {
				return len(na2) < len(nb2)
			}
			if na2 != nb2 {
				return na2 < nb2
			}
			a, b = ra, rb
			continue
		}
		if da != db {
			return !da // a letter sorts before a digit: 6.1.0-rc1 < 6.1.0-1
		}
		sa, ra := splitRun(a, false)
		sb, rb := splitRun(b, false)
		if sa != sb {
			return sa < sb
		}
		a, b = ra, rb
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func splitRun(s string, digits bool) (string, string) {
	i := 0
	for i < len(s) && isDigit(s[i]) == digits {
		i++
	}
	return s[:i], s[i:]
}
