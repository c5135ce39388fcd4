package testbed

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// DebianStockOS is the lab's stock cloud image: what an operator deploys from a
// vendor, with nothing of bcd in it. Its root (scripts/build-debian-stock-image.sh)
// is Debian bookworm (debootstrap minbase) with systemd, Debian's kernel and
// initramfs-tools, cloud-init (NoCloud among its datasources, the default user
// "debian") and openssh-server; no bcd binary, unit, join oneshot or proxy
// generator, no /boot/bcd-cmdline and no /etc/kernel/cmdline, and no network
// configuration of its own (cloud-init's fallback takes DHCP). Debian's own
// /vmlinuz and /initrd.img symlinks are kept, as a vendor's image has them.
//
// The disk is a GPT whose ESP boots both firmwares (BootDisk) with Cmdline, as a
// vendor's image carries its boot loader's configuration; deploy does not read
// that, so a kexec after a deploy boots root=PARTUUID=… with the ramdisk's
// console= parameters. Build writes the disk as qemu-img convert -c -O qcow2
// makes it (compressed clusters), the format the vendors publish.
//
// The root is cached under Cache keyed on its script's hash; the raw disk and
// the qcow2 on the root and Cmdline.
type DebianStockOS struct {
	// Cmdline is the disk's own loaders' kernel command line (syslinux's and the
	// unified kernel image's), for boots from the disk.
	Cmdline string
	// Cache is the build cache; empty means <repo>/.cache/debian-stock.
	Cache string
	// Repo is the repository's root, where scripts/ is; empty means "..".
	Repo string
	// Log gets the builders' progress lines; nil discards them.
	Log io.Writer
}

// debianStockVersion changes the image key when this file changes how it builds.
const debianStockVersion = "1"

// The stock image's ESP: syslinux's copy of the kernel and initramfs and the
// unified kernel image both live there.
const debianStockESPMiB = 96

// Build writes the compressed qcow2 to path (a copy of the cached one) and
// returns the disk's virtual size in bytes, the qcow2 header's.
func (o DebianStockOS) Build(path string) (int64, error) {
	repo := o.Repo
	if repo == "" {
		repo = ".."
	}
	repo, err := filepath.Abs(repo)
	if err != nil {
		return 0, err
	}
	cache := o.Cache
	if cache == "" {
		cache = filepath.Join(repo, ".cache", "debian-stock")
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	root, err := runRootScript(repo, "build-debian-stock-image.sh", cache, logw)
	if err != nil {
		return 0, err
	}
	kernel, initrd, err := debianStockKernel(root)
	if err != nil {
		return 0, err
	}
	for _, p := range []string{"usr/local/bin/bcd", "etc/systemd/system/bcd.service", "boot/bcd-cmdline", "etc/kernel/cmdline"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			return 0, fmt.Errorf("testbed: the stock root %s has /%s", root, p)
		}
	}

	h := sha256.New()
	fmt.Fprintf(h, "v%s\nroot %s\ncmdline %q\n", debianStockVersion, root, o.Cmdline)
	key := hex.EncodeToString(h.Sum(nil))[:16]
	images := filepath.Join(cache, "images")
	cached := filepath.Join(images, key+".qcow2")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return 0, err
	}
	lock, err := os.OpenFile(filepath.Join(images, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("testbed: lock %s: %w", lock.Name(), err)
	}
	if _, err := os.Stat(cached); err != nil {
		fmt.Fprintf(logw, "debian stock image: building %s\n", cached)
		old, _ := filepath.Glob(filepath.Join(images, "*.qcow2"))
		for _, p := range old {
			os.Remove(p)
		}
		if err := o.buildImage(root, kernel, initrd, cached+".tmp"); err != nil {
			os.Remove(cached + ".tmp")
			return 0, err
		}
		if err := os.Rename(cached+".tmp", cached); err != nil {
			return 0, err
		}
	} else {
		fmt.Fprintf(logw, "debian stock image: cached %s\n", cached)
	}
	if err := copyFile(cached, path); err != nil {
		return 0, err
	}
	return qcow2VirtualSize(path)
}

// debianStockKernel finds the kernel and initramfs as Debian lays them out:
// /vmlinuz and /initrd.img, symlinks into /boot.
func debianStockKernel(root string) (kernel, initrd string, err error) {
	var paths [2]string
	for i, name := range []string{"vmlinuz", "initrd.img"} {
		link, err := os.Readlink(filepath.Join(root, name))
		if err != nil {
			return "", "", fmt.Errorf("testbed: the stock root has no /%s symlink: %w", name, err)
		}
		paths[i] = filepath.Join(root, strings.TrimPrefix(link, "/"))
		if fi, err := os.Stat(paths[i]); err != nil || !fi.Mode().IsRegular() {
			return "", "", fmt.Errorf("testbed: the stock root's /%s points to %s, which is not a file", name, link)
		}
	}
	return paths[0], paths[1], nil
}

// buildImage lays the root out on a raw disk and converts it to a compressed
// qcow2 at path.
func (o DebianStockOS) buildImage(root, kernel, initrd, path string) error {
	work, err := os.MkdirTemp(filepath.Dir(path), "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	rootMiB, err := duMiB(root)
	if err != nil {
		return err
	}
	size := debianStockESPMiB + 2 + rootMiB*5/4 + 128
	size = (size + 63) / 64 * 64
	raw := filepath.Join(work, "disk.img")
	if err := (BootDisk{Path: raw, SizeMiB: size, ESPMiB: debianStockESPMiB, Kernel: kernel, Initrd: initrd,
		Cmdline: o.Cmdline, RootDir: root}).Build(); err != nil {
		return err
	}
	if out, err := exec.Command("qemu-img", "convert", "-c", "-O", "qcow2", raw, path).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: qemu-img convert -c -O qcow2: %v: %s", err, out)
	}
	return nil
}

// qcow2VirtualSize is the virtual size in a qcow2 header (big-endian at 24).
func qcow2VirtualSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var hdr [32]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return 0, fmt.Errorf("testbed: %s: %w", path, err)
	}
	if string(hdr[:4]) != "QFI\xfb" {
		return 0, fmt.Errorf("testbed: %s is not a qcow2", path)
	}
	var n int64
	for _, b := range hdr[24:32] {
		n = n<<8 | int64(b)
	}
	return n, nil
}

// runRootScript runs scripts/NAME CACHE (a root builder, cached) with its
// progress lines going to logw, and returns the root it printed last.
func runRootScript(repo, name, cache string, logw io.Writer) (string, error) {
	cmd := exec.Command(filepath.Join(repo, "scripts", name), cache)
	cmd.Dir = repo
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(pw, &stderr)
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintln(logw, sc.Text())
		}
		close(done)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return "", fmt.Errorf("testbed: scripts/%s: %v: %s", name, err, bytes.TrimSpace(stderr.Bytes()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return lines[len(lines)-1], nil
}
