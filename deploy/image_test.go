package deploy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
)

// Test disk images are built once per variant with the real tools (sgdisk,
// mkfs.ext4, e2fsck -D, mkfs.vfat, mtools) into a directory shared by the tests.

var (
	imageDir     string
	imageMu      sync.Mutex
	imageVariant = map[string]*testImage{}
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deploy-test-images-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	imageDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type imageOpts struct {
	// fat32 makes a 40 MiB FAT32 ESP of more than 65,525 clusters; otherwise an
	// 8 MiB FAT12.
	fat32 bool
	// bls puts systemd-boot loader entries and a kernel on the ESP.
	bls bool
	// namedRoot types the root partition Linux filesystem named "root" instead of
	// Linux root (x86-64).
	namedRoot bool
	// cmdlineFile writes /boot/bcd-cmdline.
	cmdlineFile bool
	// slowLink makes /boot/vmlinuz a symlink too long to be stored in the inode.
	slowLink bool
}

type testImage struct {
	path                 string
	size                 int64
	sha256               string
	espStart, espSize    int64
	rootStart, rootSize  int64
	dataStart, dataSize  int64
	kernel, initrd       []byte
	blsKernel, blsInitrd []byte
	ucode                []byte
	rootGUID             string
	opts                 imageOpts
}

const (
	kernelVersion = "6.1.0-13-amd64"
	longVersion   = "6.1.0-13-amd64-with-a-local-version-long-enough-to-need-a-slow-symlink"
	bcdCmdline    = "console=ttyS0,115200 bcd.test=from-image"
	blsOptions    = "root=LABEL=root ro bcd.test=from-bls"
	etcFiles      = 600
)

func needImageTools(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"sgdisk", "mkfs.ext4", "e2fsck", "debugfs", "mkfs.vfat", "mmd", "mcopy", "mdir", "mtype", "fsck.vfat"} {
		testenv.NeedTool(t, tool)
	}
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func fileSHA(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// image returns the variant's disk image, building it on first use.
func image(t testing.TB, o imageOpts) *testImage {
	t.Helper()
	needImageTools(t)
	key := fmt.Sprintf("%+v", o)
	imageMu.Lock()
	defer imageMu.Unlock()
	if img := imageVariant[key]; img != nil {
		return img
	}
	dir, err := os.MkdirTemp(imageDir, "img-")
	if err != nil {
		t.Fatal(err)
	}
	img := buildImage(t, dir, o)
	imageVariant[key] = img
	return img
}

func buildImage(t testing.TB, dir string, o imageOpts) *testImage {
	img := &testImage{opts: o, kernel: randBytes(1, 300<<10), initrd: randBytes(2, 200<<10)}
	// The root filesystem, staged.
	stage := filepath.Join(dir, "stage")
	for _, d := range []string{"etc", "boot", "usr/lib", "opt"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel string, b []byte, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(stage, rel), b, mode); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < etcFiles; i++ {
		write(fmt.Sprintf("etc/conf-%03d", i), []byte(fmt.Sprintf("setting %d\n", i)), 0o644)
	}
	write("etc/hostname", []byte("image-hostname\n"), 0o644)
	write("usr/lib/os-release", []byte("ID=debian\nVERSION_ID=12\n"), 0o644)
	if err := os.Symlink("../usr/lib/os-release", filepath.Join(stage, "etc/os-release")); err != nil {
		t.Fatal(err)
	}
	version := kernelVersion
	if o.slowLink {
		version = longVersion
	}
	write("boot/vmlinuz-"+version, img.kernel, 0o644)
	write("boot/initrd.img-"+version, img.initrd, 0o644)
	if o.slowLink {
		// Red Hat style: /boot/vmlinuz names the kernel, and the name is long.
		if err := os.Symlink("vmlinuz-"+version, filepath.Join(stage, "boot/vmlinuz")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/boot/initrd.img-"+version, filepath.Join(stage, "boot/initrd.img")); err != nil {
			t.Fatal(err)
		}
	} else {
		// Debian style: symlinks at the top.
		if err := os.Symlink("boot/vmlinuz-"+version, filepath.Join(stage, "vmlinuz")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("boot/initrd.img-"+version, filepath.Join(stage, "initrd.img")); err != nil {
			t.Fatal(err)
		}
	}
	if o.cmdlineFile {
		write("boot/bcd-cmdline", []byte(bcdCmdline+"\n# comment\n"), 0o644)
	}
	rootSize := int64(24 << 20)
	root := filepath.Join(dir, "root.img")
	if err := os.WriteFile(root, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(root, rootSize); err != nil {
		t.Fatal(err)
	}
	label := "rootfs"
	if o.namedRoot {
		label = "root"
	}
	run(t, "mkfs.ext4", "-q", "-F", "-L", label, "-d", stage, root)
	// mkfs.ext4 -d writes linear directories; e2fsck -D indexes them, as a
	// long-lived /etc is. It exits 1 for "modified".
	cmd := exec.Command("e2fsck", "-fyD", root)
	if out, err := cmd.CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Fatalf("e2fsck -fyD: %v\n%s", err, out)
		}
	}
	if out := run(t, "debugfs", "-R", "htree /etc", root); !strings.Contains(out, "Root node dump") {
		t.Fatalf("/etc is not an indexed directory:\n%.500s", out)
	}

	// The ESP.
	espSize := int64(8 << 20)
	args := []string{}
	if o.fat32 {
		espSize = 40 << 20
		args = []string{"-F", "32", "-s", "1"}
	}
	esp := filepath.Join(dir, "esp.img")
	if err := os.WriteFile(esp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(esp, espSize); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.vfat", append(args, esp)...)
	if o.fat32 {
		if out := run(t, "fsck.vfat", "-n", esp); !strings.Contains(out, "clusters") {
			t.Fatalf("fsck.vfat: %s", out)
		} else if n := clusters(out); n < 65525 {
			t.Fatalf("FAT32 of %d clusters, want at least 65525", n)
		}
	}
	efi := filepath.Join(dir, "BOOTX64.EFI")
	if err := os.WriteFile(efi, randBytes(3, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT")
	run(t, "mcopy", "-i", esp, efi, "::/EFI/BOOT/BOOTX64.EFI")
	if o.bls {
		img.blsKernel, img.blsInitrd, img.ucode = randBytes(4, 256<<10), randBytes(5, 128<<10), randBytes(6, 16<<10)
		files := map[string][]byte{
			"vmlinuz":     img.blsKernel,
			"initrd":      img.blsInitrd,
			"ucode":       img.ucode,
			"old.conf":    []byte("title Debian old\nversion 6.1.0-9\nlinux /debian/6.1.0-9/vmlinuz\n"),
			"new.conf":    []byte("title Debian\nversion 6.1.0-13\nlinux /debian/6.1.0-13/vmlinuz\ninitrd /debian/6.1.0-13/ucode\ninitrd /debian/6.1.0-13/initrd\noptions root=LABEL=root ro\noptions bcd.test=from-bls\n"),
			"loader.conf": []byte("timeout 3\ndefault new.conf\n"),
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		run(t, "mmd", "-i", esp, "::/loader", "::/loader/entries", "::/debian", "::/debian/6.1.0-13")
		for _, f := range []string{"vmlinuz", "initrd", "ucode"} {
			run(t, "mcopy", "-i", esp, filepath.Join(dir, f), "::/debian/6.1.0-13/"+f)
		}
		run(t, "mcopy", "-i", esp, filepath.Join(dir, "old.conf"), "::/loader/entries/debian-6.1.0-9.conf")
		run(t, "mcopy", "-i", esp, filepath.Join(dir, "new.conf"), "::/loader/entries/new.conf")
		run(t, "mcopy", "-i", esp, filepath.Join(dir, "loader.conf"), "::/loader/loader.conf")
	}

	// A data partition of noise, so the image is not all filesystems and zeros.
	dataSize := int64(4 << 20)
	disk := filepath.Join(dir, "disk.img")
	img.espStart, img.espSize = 1<<20, espSize
	img.rootStart, img.rootSize = img.espStart+espSize, rootSize
	img.dataStart, img.dataSize = img.rootStart+rootSize, dataSize
	img.size = img.dataStart + dataSize + 1<<20
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, img.size); err != nil {
		t.Fatal(err)
	}
	rootType, rootName := "8304", "linux-root"
	if o.namedRoot {
		rootType, rootName = "8300", "root"
	}
	run(t, "sgdisk",
		fmt.Sprintf("-n1:%d:+%dM", img.espStart/512, espSize>>20), "-t1:ef00", "-c1:EFI System",
		fmt.Sprintf("-n2:%d:+%dM", img.rootStart/512, rootSize>>20), "-t2:"+rootType, "-c2:"+rootName,
		fmt.Sprintf("-n3:%d:+%dM", img.dataStart/512, dataSize>>20), "-t3:8300", "-c3:data",
		disk)
	out := run(t, "sgdisk", "-i", "2", disk)
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Partition unique GUID: "); ok {
			img.rootGUID = strings.ToLower(strings.TrimSpace(v))
		}
	}
	copyInto(t, disk, esp, img.espStart)
	copyInto(t, disk, root, img.rootStart)
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(randBytes(7, int(dataSize)), img.dataStart); err != nil {
		t.Fatal(err)
	}
	f.Close()
	img.path = disk
	img.sha256 = fileSHA(t, disk)
	return img
}

func clusters(fsckOut string) int {
	// "esp.img: 2 files, 3/80628 clusters"
	var files, used, total int
	for _, line := range strings.Split(fsckOut, "\n") {
		if i := strings.Index(line, ": "); i >= 0 {
			if n, _ := fmt.Sscanf(line[i+2:], "%d files, %d/%d clusters", &files, &used, &total); n == 3 {
				return total
			}
		}
	}
	return 0
}

// copyInto copies src into dst at off, skipping zero blocks so dst stays sparse.
func copyInto(t testing.TB, dst, src string, off int64) {
	t.Helper()
	in, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	zero := make([]byte, 4096)
	for i := 0; i < len(in); i += 4096 {
		b := in[i:min(i+4096, len(in))]
		if bytes.Equal(b, zero[:len(b)]) {
			continue
		}
		if _, err := out.WriteAt(b, off+int64(i)); err != nil {
			t.Fatal(err)
		}
	}
}
