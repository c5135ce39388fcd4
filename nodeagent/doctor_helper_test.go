package nodeagent

import (
	"bytes"
	"context"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

// helperNode is a [helper] node's files in a root-owned tree: config.toml
// 0640 root:<nobody's group>, the socket's directory, the slots' and the
// entrypoint's directories, each root's 0755.
type helperNode struct {
	base, cfgPath string
	cfg           *config.Config
	nobody        *user.User
}

// newHelperNode builds the tree under /run, not the test's temporary
// directory: /tmp is 1777, so every chain from / through it fails, and the
// test's point is a chain that passes until one link of it is broken.
func newHelperNode(t *testing.T) *helperNode {
	t.Helper()
	testenv.NeedRoot(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		testenv.Skip(t, "no user nobody: "+err.Error())
	}
	base, err := os.MkdirTemp("/run", "bcd-doctor-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	for _, d := range []string{"", "etc", "etc/bcd", "run", "run/bcd-helper", "usr", "usr/local", "usr/local/lib", "usr/local/bin"} {
		p := filepath.Join(base, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f := newNodeFixture(t, protocol.RoleNode)
	c := *f.cfg
	c.Helper = &config.Helper{Socket: filepath.Join(base, "run/bcd-helper/helper.sock"), User: "nobody"}
	c.Update = &config.Update{SlotsDir: filepath.Join(base, "usr/local/lib/bcd"), Entrypoint: filepath.Join(base, "usr/local/bin/bcd")}
	h := &helperNode{base: base, cfgPath: filepath.Join(base, "etc/bcd/config.toml"), cfg: &c, nobody: nobody}
	if err := os.WriteFile(h.cfgPath, config.Format(&c), 0o640); err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.Atoi(nobody.Gid)
	if err := os.Chown(h.cfgPath, 0, gid); err != nil {
		t.Fatal(err)
	}
	return h
}

// lines runs doctor and returns its output lines for the check name.
func (h *helperNode) lines(t *testing.T, name string, root bool) []string {
	t.Helper()
	checks := DoctorChecks(h.cfgPath, DoctorOptions{IsRoot: func() bool { return root }})
	var out bytes.Buffer
	RunChecks(context.Background(), &out, checks)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(l, name+": ") {
			got = append(got, l)
		}
	}
	return got
}

// TestDoctorHelperChecks: as root on a [helper] node, bcd doctor has one
// helper line per path bcd helper would refuse to start on, with the path and
// what is wrong, or one ok line; the node's 0640 config.toml in its group is
// fine for the config check; run as anyone else, the helper checks say they
// need root.
func TestDoctorHelperChecks(t *testing.T) {
	h := newHelperNode(t)
	if got := h.lines(t, "helper", true); len(got) != 1 || got[0] != "helper: ok: "+helperOK {
		t.Fatalf("a sound helper node: %q", got)
	}
	if got := h.lines(t, "config", true); len(got) != 1 || !strings.HasPrefix(got[0], "config: ok: ") || !strings.Contains(got[0], "group "+h.nobody.Gid+": bcd node reads it as nobody") {
		t.Errorf("config.toml 0640 in the node's group: %q, want ok", got)
	}
	if got := h.lines(t, "helper", false); len(got) != 1 || got[0] != "helper: warn: the helper checks need root (bcd helper checks the ownership of its config, socket directory and slots path as root): run sudo bcd doctor" {
		t.Errorf("not root: %q", got)
	}

	// root:staff 2775 /usr/local/lib, as older Debian has it.
	lib := filepath.Join(h.base, "usr/local/lib")
	os.Chmod(lib, 0o775|os.ModeSetgid)
	got := h.lines(t, "helper", true)
	if want := "helper: fail: " + lib + ": mode 2775 is writable by group or other (chmod go-w): bcd helper refuses to start"; len(got) != 1 || got[0] != want {
		t.Errorf("group-writable %s: %q, want %q", lib, got, want)
	}

	// Two more at once: a config.toml the node owns and a socket directory
	// it could write; each its own failed line, in the helper's order.
	uid, _ := strconv.Atoi(h.nobody.Uid)
	os.Chown(h.cfgPath, uid, -1)
	sock := filepath.Join(h.base, "run/bcd-helper")
	os.Chmod(sock, 0o777)
	got = h.lines(t, "helper", true)
	want := []string{
		"helper: fail: " + h.cfgPath + ": owned by uid " + h.nobody.Uid + ", not root; the config decides what root does for the node, so only root may write it: bcd helper refuses to start",
		"helper: fail: " + sock + ": the socket's directory: mode 0777 is writable by group or other (chmod go-w): bcd helper refuses to start",
		"helper: fail: " + lib + ": mode 2775 is writable by group or other (chmod go-w): bcd helper refuses to start",
		"helper: fail: " + sock + ": mode 0777 is writable by group or other (chmod go-w): bcd helper refuses to start",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("three broken links:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// And doctor exits 1 on them.
	var out bytes.Buffer
	if !RunChecks(context.Background(), &out, DoctorChecks(h.cfgPath, DoctorOptions{})) {
		t.Errorf("doctor did not fail:\n%s", out.String())
	}

	// A node without [helper] has no helper line.
	f := newNodeFixture(t, protocol.RoleNode)
	if got := (&helperNode{cfgPath: f.cfgPath}).lines(t, "helper", true); len(got) != 0 {
		t.Errorf("a root node: %q, want no helper line", got)
	}
}

// TestDoctorHelperTPMAndLibvirt: the whole of doctor on a [helper] node whose
// user is in tss fails the tpm check with the spec's message; a host without
// qemu.conf has no libvirt line, one with it a libvirt line.
func TestDoctorHelperTPMAndLibvirt(t *testing.T) {
	h := newHelperNode(t)
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tf, lf := hostTPMFiles, hostLibvirtFiles
	t.Cleanup(func() { hostTPMFiles, hostLibvirtFiles = tf, lf })
	hostTPMFiles = tpmFiles{Group: write("group", "tss:x:106:nobody\nnobody:x:65534:libvirt-qemu\n"),
		Passwd: write("passwd", "libvirt-qemu:x:64055:108::/var/lib/libvirt:/usr/sbin/nologin\n"), Device: filepath.Join(dir, "tpmrm0")}
	hostLibvirtFiles = libvirtFiles{QemuConf: filepath.Join(dir, "qemu.conf"), Group: hostTPMFiles.Group, Passwd: hostTPMFiles.Passwd}
	want := "tpm: fail: nobody is in the tss group: it can send the TPM any command (lock or clear its hierarchies); bcd helper holds the node keys, so remove it (gpasswd -d nobody tss) and restart bcd.service"
	if got := h.lines(t, "tpm", true); len(got) != 1 || got[0] != want {
		t.Errorf("tpm: %q, want %q", got, want)
	}
	if got := h.lines(t, "libvirt", true); len(got) != 0 {
		t.Errorf("no qemu.conf: %q, want no libvirt line", got)
	}
	write("qemu.conf", "dynamic_ownership = 0\n")
	want = "libvirt: ok: dynamic_ownership = 0 in " + hostLibvirtFiles.QemuConf + ", libvirt-qemu in the nobody group, nobody not in the libvirt group"
	if got := h.lines(t, "libvirt", true); len(got) != 1 || got[0] != want {
		t.Errorf("with qemu.conf: %q, want %q", got, want)
	}
}

// TestCheckLibvirt: on a helper node the libvirt check fails unless
// qemu.conf has dynamic_ownership = 0, QEMU's user (libvirt-qemu or qemu) is
// in the node's group and the node's user is not in libvirt, and says what to
// do; a root node's libvirt is libvirt's own.
func TestCheckLibvirt(t *testing.T) {
	const (
		passwdDebian = "root:x:0:0::/root:/bin/sh\nbcd:x:999:999::/var/lib/bcd:/usr/sbin/nologin\nlibvirt-qemu:x:64055:108::/var/lib/libvirt:/usr/sbin/nologin\n"
		passwdFedora = "bcd:x:999:999::/var/lib/bcd:/usr/sbin/nologin\nqemu:x:107:107::/:/sbin/nologin\n"
		good         = "bcd:x:999:libvirt-qemu\nlibvirt:x:120:\n"
	)
	for _, tc := range []struct {
		name                string
		helper              bool
		conf, group, passwd string
		level               Level
		want                []string
	}{
		{name: "set up", helper: true, conf: "# stock\n#dynamic_ownership = 1\ndynamic_ownership = 0\n", group: good, passwd: passwdDebian,
			level: OK, want: []string{"dynamic_ownership = 0 in ", "libvirt-qemu in the bcd group, bcd not in the libvirt group"}},
		{name: "qemu on Fedora", helper: true, conf: "dynamic_ownership=0 # bcd\n", group: "bcd:x:999:qemu\n", passwd: passwdFedora,
			level: OK, want: []string{"qemu in the bcd group"}},
		{name: "stock qemu.conf", helper: true, conf: "# stock\n#dynamic_ownership = 1\n", group: good, passwd: passwdDebian,
			level: Fail, want: []string{"does not set dynamic_ownership = 0", "rerun the install script generated with --unprivileged"}},
		{name: "dynamic_ownership 1", helper: true, conf: "dynamic_ownership = 0\ndynamic_ownership = 1\n", group: good, passwd: passwdDebian,
			level: Fail, want: []string{"sets dynamic_ownership = 1, want 0", "rerun the install script generated with --unprivileged"}},
		{name: "qemu's user not in bcd", helper: true, conf: "dynamic_ownership = 0\n", group: "bcd:x:999:\n", passwd: passwdDebian,
			level: Fail, want: []string{"libvirt-qemu is not in the bcd group", "gpasswd -a libvirt-qemu bcd", "rerun the install script generated with --unprivileged"}},
		{name: "bcd in libvirt (an older script)", helper: true, conf: "dynamic_ownership = 0\n", group: good + "libvirt:x:121:root,bcd\n", passwd: passwdDebian,
			level: Fail, want: []string{"bcd is in the libvirt group, which is root-equivalent", "gpasswd -d bcd libvirt", "rerun the install script generated with --unprivileged"}},
		{name: "no qemu user", helper: true, conf: "dynamic_ownership = 0\n", group: good, passwd: "bcd:x:999:999::/:/bin/false\n",
			level: Fail, want: []string{"neither libvirt-qemu nor qemu is a user here"}},
		{name: "a root node", conf: "#dynamic_ownership = 1\n", group: "libvirt:x:120:bcd\n", passwd: passwdDebian,
			level: OK, want: []string{"bcd node runs as root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, s string) string {
				p := filepath.Join(dir, name)
				if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			}
			f := libvirtFiles{QemuConf: write("qemu.conf", tc.conf), Group: write("group", tc.group), Passwd: write("passwd", tc.passwd)}
			cfg := &config.Config{}
			if tc.helper {
				cfg.Helper = &config.Helper{User: "bcd"}
			}
			got := checkLibvirt(cfg, f)
			if got.Level != tc.level {
				t.Errorf("%v %q, want %v", got.Level, got.Detail, tc.level)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Detail, w) {
					t.Errorf("%q lacks %q", got.Detail, w)
				}
			}
		})
	}
	if hasLibvirt(libvirtFiles{QemuConf: filepath.Join(t.TempDir(), "qemu.conf")}) {
		t.Error("hasLibvirt without qemu.conf")
	}
}
