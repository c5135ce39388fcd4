package testbed

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/better-compute/bcd/nodeagent/installscript"
)

// DebianOS is the lab's heavier test OS flavour: Debian bookworm (debootstrap
// minbase) booting with systemd, in which bcd node runs under the spec's hardened
// bcd.service, the very unit the install script writes (installscript.BCDUnit).
//
// Its disk is laid out like TestOS's: a GPT whose ESP boots both firmwares
// (BootDisk), and an ext4 root labelled "root" holding real /boot/vmlinuz and
// /boot/initrd.img (Debian's kernel and its initramfs-tools image, which loads
// virtio_blk and ext4 to find the root) and /boot/bcd-cmdline, which deploy reads
// for the kexec. The root (scripts/build-debian-image.sh) has systemd-networkd
// taking an address by DHCP on every ethernet link, a generator that hands the
// kernel's bcd.proxy= to bcd's units as HTTPS_PROXY (the site's proxy is the
// machines' only way out), bcd-join.service, which runs bcd join --token-file
// /etc/bcd/join-token --node-id … before bcd.service when a deploy wrote the
// token, and the lab's oneshots: bcd-lab-report.service prints how bcd.service
// runs (systemctl show, /proc/PID/status) on the serial console, and
// bcd-lab-install.service runs an install script that a test put under
// /etc/bcd-lab-install with the join token on its standard input. root has no
// password.
//
// Both steps are cached under Cache: the root, keyed on the script's hash and
// rebuilt only when it changes; the disk image, keyed on the root, bcd, the unit
// and the command line.
type DebianOS struct {
	Bcd string // a static bcd binary, installed as /usr/local/bin/bcd
	// Cmdline is the kernel command line of every boot (both loaders and
	// /boot/bcd-cmdline for deploy's kexec): it needs root=LABEL=root, and
	// bcd.proxy= for bcd to reach the gateway through the site's proxy.
	Cmdline string
	// Cache is the build cache; empty means <repo>/.cache/debian.
	Cache string
	// Repo is the repository's root, where scripts/ is; empty means "..".
	Repo string
	// Log gets the builders' progress lines; nil discards them.
	Log io.Writer
}

// Where DebianOS puts bcd, and its ESP's size: the UKI and syslinux's copy of the
// kernel and initramfs both live there.
const (
	debianBcdPath   = "/usr/local/bin/bcd"
	debianUnitWants = "/etc/systemd/system/multi-user.target.wants/bcd.service"
	debianESPMiB    = 96
)

// debianImageVersion changes the image key when this file changes how it builds.
const debianImageVersion = "1"

// Build writes the disk image to path (a copy of the cached one, which a VM may
// then write to). It returns the image's size in MiB.
func (o DebianOS) Build(path string) (int, error) {
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
		cache = filepath.Join(repo, ".cache", "debian")
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	root, err := o.buildRoot(repo, cache, logw)
	if err != nil {
		return 0, err
	}

	h := sha256.New()
	sum, err := fileSHA256(o.Bcd)
	if err != nil {
		return 0, fmt.Errorf("testbed: debian image: bcd: %w", err)
	}
	fmt.Fprintf(h, "v%s\nroot %s\ncmdline %q\nbcd %s\nunit %q\n", debianImageVersion, root, o.Cmdline, sum, installscript.BCDUnit)
	key := hex.EncodeToString(h.Sum(nil))[:16]
	images := filepath.Join(cache, "images")
	cached := filepath.Join(images, key+".img")
	if err := os.MkdirAll(images, 0o755); err != nil {
		return 0, err
	}
	// One test process at a time builds, prunes or copies images.
	lock, err := os.OpenFile(filepath.Join(images, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("testbed: lock %s: %w", lock.Name(), err)
	}
	if _, err := os.Stat(cached); err != nil {
		fmt.Fprintf(logw, "debian image: building %s\n", cached)
		// Images of older builds of bcd are of no more use.
		old, _ := filepath.Glob(filepath.Join(images, "*.img"))
		for _, p := range old {
			os.Remove(p)
		}
		if err := o.buildImage(root, cached+".tmp"); err != nil {
			os.Remove(cached + ".tmp")
			return 0, err
		}
		if err := os.Rename(cached+".tmp", cached); err != nil {
			return 0, err
		}
	} else {
		fmt.Fprintf(logw, "debian image: cached %s\n", cached)
	}
	if out, err := exec.Command("cp", "--sparse=always", cached, path).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("testbed: cp %s: %v: %s", cached, err, out)
	}
	return int(fileSize(path) >> 20), nil
}

// buildRoot runs scripts/build-debian-image.sh (cached) and returns the root.
func (o DebianOS) buildRoot(repo, cache string, logw io.Writer) (string, error) {
	cmd := exec.Command(filepath.Join(repo, "scripts", "build-debian-image.sh"), cache)
	cmd.Dir = repo
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	// Progress lines as they come: debootstrap takes minutes.
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
		return "", fmt.Errorf("testbed: scripts/build-debian-image.sh: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	root := lines[len(lines)-1]
	if fi, err := os.Stat(filepath.Join(root, "boot", "vmlinuz")); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("testbed: scripts/build-debian-image.sh printed %q, which has no /boot/vmlinuz", root)
	}
	return root, nil
}

// buildImage copies the root, adds bcd, its unit and the command line, and lays
// out the disk.
func (o DebianOS) buildImage(root, path string) error {
	work, err := os.MkdirTemp("", "bcd-debian-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "root")
	if out, err := exec.Command("cp", "-a", "--reflink=auto", root, tree).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: cp -a %s: %v: %s", root, err, out)
	}
	bin := filepath.Join(tree, debianBcdPath)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	if err := copyFile(o.Bcd, bin); err != nil {
		return err
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return err
	}
	// The unit byte for byte as the install script writes it, enabled as its
	// systemctl enable does.
	if err := os.WriteFile(filepath.Join(tree, installscript.UnitPath), []byte(installscript.BCDUnit), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(tree, filepath.Dir(debianUnitWants)), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(installscript.UnitPath, filepath.Join(tree, debianUnitWants)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tree, "boot/bcd-cmdline"), []byte(o.Cmdline+"\n"), 0o644); err != nil {
		return err
	}

	rootMiB, err := duMiB(tree)
	if err != nil {
		return err
	}
	// ext4's own metadata, free space for bcd's data and the journal, the ESP
	// and the backup GPT; whole 64 MiB.
	size := debianESPMiB + 2 + rootMiB*5/4 + 128
	size = (size + 63) / 64 * 64
	return BootDisk{Path: path, SizeMiB: size, ESPMiB: debianESPMiB,
		Kernel: filepath.Join(tree, "boot/vmlinuz"), Initrd: filepath.Join(tree, "boot/initrd.img"),
		Cmdline: o.Cmdline, RootDir: tree}.Build()
}

func duMiB(dir string) (int, error) {
	out, err := exec.Command("du", "-sm", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("testbed: du %s: %w", dir, err)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return 0, errors.New("testbed: du printed nothing")
	}
	return strconv.Atoi(f[0])
}

// debianRootOffset is the byte offset of the ext4 root in a DebianOS image, for
// debugfs to write into it without mounting.
const debianRootOffset = int64(espStart)*512 + debianESPMiB<<20
