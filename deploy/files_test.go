package deploy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/bcd/protocol"
)

// extAt reads the ext filesystem at off in disk with debugfs, independently of
// the package's own debugfs code.
type extAt struct {
	t    *testing.T
	spec string
}

func newExtAt(t *testing.T, disk string, off int64) extAt {
	return extAt{t, fmt.Sprintf("%s?offset=%d", disk, off)}
}

func (e extAt) cat(p string) string {
	e.t.Helper()
	cmd := exec.Command("debugfs", "-R", "cat "+p, e.spec)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || strings.Contains(stderr.String(), "not found") {
		e.t.Fatalf("debugfs cat %s: %v %s", p, err, stderr.String())
	}
	return string(out)
}

var statRE = regexp.MustCompile(`Type: (\S+)\s+Mode:\s+(\d+)[\s\S]*User:\s+(\d+)\s+Group:\s+(\d+)`)

// stat returns type, mode (octal digits), uid and gid.
func (e extAt) stat(p string) (typ, mode, uid, gid string) {
	e.t.Helper()
	out := run(e.t, "debugfs", "-R", "stat "+p, e.spec)
	m := statRE.FindStringSubmatch(out)
	if m == nil {
		e.t.Fatalf("debugfs stat %s: %s", p, out)
	}
	return m[1], m[2], m[3], m[4]
}

func (e extAt) fsck() {
	e.t.Helper()
	run(e.t, "e2fsck", "-fn", e.spec)
}

// fatAt extracts the FAT filesystem at off into a file of its own, since
// fsck.vfat takes no offset.
func fatAt(t *testing.T, disk string, off, size int64) string {
	t.Helper()
	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "esp.img")
	if err := os.WriteFile(p, b[off:off+size], 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const joinToken = "bcjt_TESTSECRETtoken0123456789"

func deployFiles() []File {
	return []File{
		{Path: "/etc/bcd/config.toml", Mode: 0o600, Content: []byte("gateway_url = \"https://gw.example\"\n")},
		{Path: "/etc/bcd/join-encryption.jwk", Mode: 0o600, Content: []byte(`{"kty":"EC"}`)},
		{Path: "/etc/bcd/join-token", Mode: 0o600, Content: []byte(joinToken)},
		{Path: "/etc/hostname", Mode: 0o644, Content: []byte("node-17\n")},
		{Path: "/etc/conf-017", Mode: 0o640, UID: 1000, GID: 1000, Content: []byte("replaced\n")},
		{Path: "/etc/os-release", Mode: 0o644, Content: []byte("ID=bcd\n")}, // a symlink in the image
		{Path: "/opt/bcd/a/b/deep.conf", Mode: 0o600, Content: []byte("deep\n")},
		{FS: protocol.FSESP, Path: "/EFI/BOOT/grub.cfg", Content: []byte("set timeout=0\n")},
		{FS: protocol.FSESP, Path: "/EFI/BOOT/BOOTX64.EFI", Content: []byte("replaced loader")},
		{FS: protocol.FSESP, Path: "/EFI/bcd/nested/dir/boot.cfg", Content: []byte("nested\n")},
	}
}

// checkFiles verifies deployFiles landed in the image at path.
func checkFiles(t *testing.T, disk string, img *testImage) {
	t.Helper()
	root := newExtAt(t, disk, img.rootStart)
	for _, f := range deployFiles() {
		if f.FS == protocol.FSESP {
			continue
		}
		if got := root.cat(f.Path); got != string(f.Content) {
			t.Errorf("%s: %q, want %q", f.Path, got, f.Content)
		}
		typ, mode, uid, gid := root.stat(f.Path)
		if typ != "regular" || mode != fmt.Sprintf("%04o", uint32(f.Mode)) || uid != fmt.Sprint(f.UID) || gid != fmt.Sprint(f.GID) {
			t.Errorf("%s: %s mode %s owner %s:%s, want regular %04o %d:%d", f.Path, typ, mode, uid, gid, uint32(f.Mode), f.UID, f.GID)
		}
	}
	for _, d := range []string{"/etc/bcd", "/opt/bcd", "/opt/bcd/a", "/opt/bcd/a/b"} {
		if typ, mode, uid, gid := root.stat(d); typ != "directory" || mode != "0755" || uid != "0" || gid != "0" {
			t.Errorf("%s: %s %s %s:%s, want directory 0755 0:0", d, typ, mode, uid, gid)
		}
	}
	// The indexed /etc is still indexed and whole.
	if out := run(t, "debugfs", "-R", "htree /etc", root.spec); !strings.Contains(out, "Root node dump") {
		t.Error("/etc is no longer indexed")
	}
	if got := root.cat("/etc/conf-599"); got != "setting 599\n" {
		t.Errorf("/etc/conf-599: %q", got)
	}
	ls := run(t, "debugfs", "-R", "ls /etc", root.spec)
	if n := strings.Count(ls, "conf-"); n != etcFiles {
		t.Errorf("/etc lists %d conf- files, want %d", n, etcFiles)
	}
	root.fsck()

	esp := fatAt(t, disk, img.espStart, img.espSize)
	for _, f := range deployFiles() {
		if f.FS != protocol.FSESP {
			continue
		}
		cmd := exec.Command("mtype", "-i", esp, "::"+f.Path)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		out, err := cmd.Output()
		if err != nil || string(out) != string(f.Content) {
			t.Errorf("ESP %s: %q (%v), want %q", f.Path, out, err, f.Content)
		}
	}
	run(t, "fsck.vfat", "-n", esp)
}

// TestDeployFiles writes the node's configuration into the root filesystem and
// boot files into the ESP, for a small FAT12 ESP and a real-sized FAT32 one.
func TestDeployFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		img  func(testing.TB) *testImage
	}{{"fat12", smallImage}, {"fat32", fat32Image}} {
		t.Run(tc.name, func(t *testing.T) {
			img := tc.img(t)
			body := compressed(t, img, protocol.FormatZstd)
			srv := serve(t, body, serveOK, false)
			target := filepath.Join(t.TempDir(), "disk.img")
			p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
			p.Files = deployFiles()
			var logs bytes.Buffer
			d := testDeployer(&fakeMachine{})
			d.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			tmp := t.TempDir()
			d.TempDir = tmp
			res, err := d.Deploy(context.Background(), p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Files) != len(p.Files) {
				t.Errorf("files written %v", res.Files)
			}
			checkFiles(t, target, img)
			if strings.Contains(logs.String(), joinToken) || strings.Contains(fmt.Sprintf("%v %+v %#v", p, p, p), joinToken) {
				t.Error("the join token reached a log or a printed params")
			}
			if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
				t.Errorf("temp files left behind: %v", entries)
			}
		})
	}
}

// TestDeployFilesRefused: a file where a directory must be, or a directory where
// a file goes, fails the deploy and wipes the disk.
func TestDeployFilesRefused(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	for _, tc := range []struct {
		name string
		file File
		want string
	}{
		{"dir in the way", File{Path: "/etc", Content: []byte("x")}, "/etc is a directory"},
		{"file as a dir", File{Path: "/etc/hostname/x", Content: []byte("x")}, "/etc/hostname is a regular file, not a directory"},
		{"esp dir in the way", File{FS: protocol.FSESP, Path: "/EFI/BOOT", Content: []byte("x")}, "/EFI/BOOT is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "disk.img")
			p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
			p.Files = []File{tc.file}
			_, err := testDeployer(&fakeMachine{}).Deploy(context.Background(), p, nil)
			if err == nil || Reason(err) != protocol.DeployReasonFiles || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v (reason %s), want %q", err, Reason(err), tc.want)
			}
			unbootable(t, target)
		})
	}
}

// TestDeployKexec: the kernel, initrd and command line that reach the loader are
// the installed OS's, found where the package says it looks.
func TestDeployKexec(t *testing.T) {
	small := smallImage(t)
	big := fat32Image(t)
	procCmdline := filepath.Join(t.TempDir(), "cmdline")
	if err := os.WriteFile(procCmdline, []byte("bcd.gateway_url=https://x console=tty0 console=ttyS0,115200n8 quiet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		img           *testImage
		after         After
		kernel        []byte
		initrd        []byte
		cmdline       string
		source        string
		noESP, noRoot bool
	}{
		{"debian symlinks and bcd-cmdline", small, After{}, small.kernel, small.initrd, bcdCmdline, "root:/vmlinuz", false, false},
		{"loader entry on the ESP", big, After{}, big.blsKernel, append(bytes.Clone(big.ucode), big.blsInitrd...), blsOptions, "esp:/loader/entries/new.conf", false, false},
		{"params", small, After{Kernel: "/boot/vmlinuz-" + kernelVersion, Cmdline: "root=/dev/sda2 x=y"}, small.kernel, nil, "root=/dev/sda2 x=y", "params", false, false},
		{"params on the ESP", big, After{FS: protocol.FSESP, Kernel: "/debian/6.1.0-13/vmlinuz", Initrd: "/debian/6.1.0-13/initrd"}, big.blsKernel, big.blsInitrd,
			"root=PARTUUID=" + big.rootGUID + " ro console=tty0 console=ttyS0,115200n8", "params", false, false},
		{"slow symlink /boot/vmlinuz", big, After{}, big.kernel, big.initrd,
			"root=PARTUUID=" + big.rootGUID + " ro console=tty0 console=ttyS0,115200n8", "root:/boot/vmlinuz", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := compressed(t, tc.img, protocol.FormatZstd)
			srv := serve(t, body, serveOK, false)
			target := filepath.Join(t.TempDir(), "disk.img")
			p := params(srv.URL, body, protocol.FormatZstd, tc.img.size, target)
			tc.after.Action = protocol.AfterKexec
			p.After = tc.after
			m := &fakeMachine{}
			d := testDeployer(m)
			d.ProcCmdline = procCmdline
			if tc.noESP {
				// Make the ESP unfindable so the root filesystem is searched.
				p.ESPPartition = 3
			}
			res, err := d.Deploy(context.Background(), p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.loads != 1 || !bytes.Equal(m.kernel, tc.kernel) {
				t.Errorf("kernel: %d loads, %d bytes, want the %d-byte kernel", m.loads, len(m.kernel), len(tc.kernel))
			}
			if !bytes.Equal(m.initrd, tc.initrd) || m.hasInitrd != (tc.initrd != nil) {
				t.Errorf("initrd: %d bytes (given %v), want %d", len(m.initrd), m.hasInitrd, len(tc.initrd))
			}
			if m.cmdline != tc.cmdline || res.Cmdline != tc.cmdline {
				t.Errorf("cmdline %q, want %q", m.cmdline, tc.cmdline)
			}
			if res.KernelSource != tc.source {
				t.Errorf("source %q, want %q", res.KernelSource, tc.source)
			}
			if m.execs != 0 {
				t.Error("Deploy jumped before Finish")
			}
			if err := d.Finish(res); err != nil || m.execs != 1 {
				t.Errorf("Finish: %v, %d execs", err, m.execs)
			}
		})
	}
}

// TestFinish: reboot, power off and none reach the machine as asked.
func TestFinish(t *testing.T) {
	m := &fakeMachine{}
	d := &Deployer{Machine: m}
	for _, a := range []string{protocol.AfterReboot, protocol.AfterPowerOff, protocol.AfterNone, ""} {
		if err := d.Finish(Result{After: a}); err != nil {
			t.Fatal(err)
		}
	}
	if m.reboots != 1 || m.downs != 1 || m.execs != 0 {
		t.Errorf("%+v", m)
	}
}

// TestLoadInstalled: machine.kexec finds the kernel of an OS already on a disk,
// and leaves the disk as it was.
func TestLoadInstalled(t *testing.T) {
	img := smallImage(t)
	target := filepath.Join(t.TempDir(), "disk.img")
	b, err := os.ReadFile(img.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m := &fakeMachine{}
	d := testDeployer(m)
	res, err := d.LoadInstalled(context.Background(), Target{Path: target}, After{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.kernel, img.kernel) || !bytes.Equal(m.initrd, img.initrd) || m.cmdline != bcdCmdline || res.After != protocol.AfterKexec {
		t.Errorf("loaded %d-byte kernel, %d-byte initrd, cmdline %q; result %+v", len(m.kernel), len(m.initrd), m.cmdline, res)
	}
	if fileSHA(t, target) != img.sha256 {
		t.Error("LoadInstalled changed the disk")
	}
	if err := d.Finish(res); err != nil || m.execs != 1 {
		t.Errorf("Finish: %v, %d execs", err, m.execs)
	}
	if _, err := d.LoadInstalled(context.Background(), Target{Path: target}, After{Initrd: "/x"}); Reason(err) != protocol.DeployReasonInvalid {
		t.Errorf("initrd without kernel: %v", err)
	}
}

// TestDeployToolMissing: without debugfs on PATH the deploy fails naming it.
func TestDeployToolMissing(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	target := filepath.Join(t.TempDir(), "disk.img")
	p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
	p.Files = deployFiles()[:1]
	t.Setenv("PATH", t.TempDir())
	_, err := testDeployer(&fakeMachine{}).Deploy(context.Background(), p, nil)
	if err == nil || Reason(err) != protocol.DeployReasonTool || !strings.Contains(err.Error(), "debugfs (e2fsprogs): tool not found on PATH") {
		t.Fatalf("err %v (reason %s)", err, Reason(err))
	}
	unbootable(t, target)
}
