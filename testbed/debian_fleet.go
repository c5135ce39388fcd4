package testbed

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/nodeagent/installscript"
	"github.com/better-compute/bcd/pki"
)

// The lab's addresses as an install script names them: the api (with the
// downloads route) and the gateway, both on the management network.
const (
	APIURL     = "https://" + apiAddr
	GatewayURL = "https://" + gatewayAddr
)

// PKIDir is the control plane's PKI bundle (better-compute pki init).
func (f *Fleet) PKIDir() string { return f.pki }

// ServingCACert is the serving CA's certificate, which a machine trusts to
// download from the api.
func (f *Fleet) ServingCACert() string { return filepath.Join(f.pki, pki.ServingCACertFile) }

// DeployImage deploys the lab's image like Deploy, but without --cmdline, so the
// kexec takes the installed root's /boot/bcd-cmdline as an operator's own image
// would have it.
func (f *Fleet) DeployImage(m *FleetMachine, extra ...string) (string, error) {
	args := append([]string{"machines", "deploy", m.Name,
		"--image", "http://" + imageAddr + "/" + filepath.Base(f.imageZst),
		"--sha256", f.imageSHA, "--size", fmt.Sprint(f.imageSize), "--format", "raw.zst",
		"--image-size", fmt.Sprint(fileSize(f.Image))}, extra...)
	return f.BC(args...)
}

// FleetNode is a node as nodes list -o json shows it.
type FleetNode struct {
	ID            string `json:"id"`
	Role          string `json:"role"`
	Site          string `json:"site"`
	Pool          string `json:"pool"`
	State         string `json:"state"`
	Connected     bool   `json:"connected"`
	SessionID     int64  `json:"session_id"`
	DaemonVersion string `json:"daemon_version"`
	DaemonArch    string `json:"daemon_arch"`
	// DaemonSection is the node's last report on its spec's daemon section.
	DaemonSection *apitype.SectionStatus `json:"daemon_section"`
}

// Nodes lists the control plane's nodes.
func (f *Fleet) Nodes() ([]FleetNode, error) {
	out, err := f.BC("nodes", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var nodes []FleetNode
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		return nil, fmt.Errorf("nodes list -o json: %w: %s", err, out)
	}
	return nodes, nil
}

// Publish puts data on the lab's image server under name (a relative path,
// atomically, for a machine polling for it through the site's proxy) and
// returns its URL; PublishURL is that URL before anything is there.
func (f *Fleet) Publish(name string, data []byte) (string, error) {
	path := filepath.Join(filepath.Dir(f.imageZst), filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	return f.PublishURL(name), nil
}

// PublishURL is the URL at which Publish puts name.
func (f *Fleet) PublishURL(name string) string { return "http://" + imageAddr + "/" + name }

// MachineNode is the node of the machine's installed OS, as nodes list shows it.
func (f *Fleet) MachineNode(m *FleetMachine) (FleetNode, bool) {
	id, _ := f.node(m)
	if id == "" {
		return FleetNode{}, false
	}
	nodes, _ := f.Nodes()
	for _, n := range nodes {
		if n.ID == id {
			return n, true
		}
	}
	return FleetNode{}, false
}

// StartDiskVM starts a VM that is no machine of the lab's: no BMC, no PXE, not
// registered. It boots disk (BIOS) with its only NIC on the provisioning bridge,
// where the site's DHCP gives it an address and the site's proxy is its only way
// out. The caller stops it (before Close).
func (f *Fleet) StartDiskVM(name, mac, disk string) (*VM, error) {
	return f.StartDiskVMWith(DiskVM{Name: name, MAC: mac, Disk: disk})
}

// DiskVM is a VM that StartDiskVMWith starts.
type DiskVM struct {
	Name, MAC, Disk string
	// TPMState, when set, gives the VM a TPM 2.0 (tpm-tis) from swtpm on that
	// state directory, which holds its seeds and so its endorsement key: a test
	// can read the EK before the boot (ReadSWTPMEK) and enroll it. Close stops
	// that swtpm.
	TPMState string
	// Reboots makes the guest's reboot boot the disk again instead of
	// ending the VM (VMConfig.Reboots): a node rebooted by nodes reboot.
	Reboots bool
}

// StartDiskVMWith starts a VM as StartDiskVM does, with a TPM when d says so.
func (f *Fleet) StartDiskVMWith(d DiskVM) (*VM, error) {
	name, mac, disk := d.Name, d.MAC, d.Disk
	tap := "tapd" + name
	if len(tap) > 15 {
		return nil, fmt.Errorf("testbed: VM name %q is too long for a tap name", name)
	}
	if err := f.site.AddTap(tap, "br0"); err != nil {
		return nil, err
	}
	var uuid [16]byte
	rand.Read(uuid[:])
	uuid[6] = uuid[6]&0x0f | 0x40
	uuid[8] = uuid[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])
	vmDir := filepath.Join(f.Dir, "vms", name)
	if err := os.MkdirAll(vmDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(vmDir, "sercon"), sercon, 0o644); err != nil {
		return nil, err
	}
	// Its own SMBIOS UUID, as every real machine has; SeaBIOS on the serial
	// console, as the lab's BMC machines have it.
	extra := []string{"-uuid", id, "-fw_cfg", "name=etc/sercon-port,file=" + filepath.Join(vmDir, "sercon")}
	tpmNote := ""
	if d.TPMState != "" {
		sock, err := f.startSWTPM(name, vmDir, d.TPMState)
		if err != nil {
			return nil, err
		}
		extra = append(extra, "-chardev", "socket,id=chrtpm,path="+sock,
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
		tpmNote = ", swtpm " + d.TPMState
	}
	vm, err := StartVM(f.site, VMConfig{Name: name, Dir: vmDir, Firmware: BIOS, MemoryMB: 1024,
		Tap: tap, MAC: mac, Disk: disk, Reboots: d.Reboots, Extra: extra})
	if err != nil {
		return nil, err
	}
	f.logf("machine %s: BIOS, MAC %s, boots its disk (no BMC, no PXE), SMBIOS UUID %s%s", name, mac, id, tpmNote)
	return vm, nil
}

// startSWTPM starts swtpm for a disk VM on its control socket in vmDir (QEMU's
// tpm emulator backend), and returns the socket once it is there.
func (f *Fleet) startSWTPM(name, vmDir, state string) (string, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", err
	}
	sock := filepath.Join(vmDir, "swtpm.sock")
	os.Remove(sock)
	p, err := StartProcess("swtpm "+name, exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state,
		"--ctrl", "type=unixio,path="+sock), filepath.Join(vmDir, "swtpm.log"))
	if err != nil {
		return "", err
	}
	f.extra = append(f.extra, p)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock, nil
		}
		select {
		case <-p.Exited():
			return "", fmt.Errorf("testbed: swtpm for %s exited: %v\n%s", name, p.Err(), p.Tail(20))
		default:
		}
	}
	return "", fmt.Errorf("testbed: swtpm for %s made no socket %s", name, sock)
}

// DebianSeed is a file a test puts into a DebianOS image's root before it boots.
type DebianSeed struct {
	Path string // absolute, in the root
	Src  string // a file on this machine
	Mode os.FileMode
	// Link, instead of Src and Mode, makes Path a symlink to Link (a unit's
	// wants link, as systemctl enable makes it).
	Link string
}

// PlainDebianDisk copies a DebianOS image to disk as a plain Debian, with
// what the image adds for a deployed node (bcd, its unit and its wants link)
// taken out, and dirs and files seeded as SeedDebianRoot does: the disk of a
// machine that an install script sets up.
func PlainDebianDisk(image, disk string, dirs []string, files []DebianSeed) error {
	if out, err := exec.Command("cp", "--sparse=always", image, disk).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: cp %s: %v: %s", image, err, out)
	}
	return SeedDebianRoot(disk, []string{debianUnitWants, installscript.UnitPath, debianBcdPath}, dirs, files)
}

// SeedDebianRoot writes files into the root of a DebianOS image with debugfs,
// without mounting it, after removing remove (files or symlinks) from it; dirs
// are made first (0700), for files in new directories.
func SeedDebianRoot(img string, remove, dirs []string, files []DebianSeed) error {
	var cmds strings.Builder
	for _, p := range remove {
		fmt.Fprintf(&cmds, "rm %s\n", p)
	}
	for _, d := range dirs {
		fmt.Fprintf(&cmds, "mkdir %s\nsif %s mode 040700\n", d, d)
	}
	for _, s := range files {
		if s.Link != "" {
			fmt.Fprintf(&cmds, "symlink %s %s\n", s.Path, s.Link)
			continue
		}
		fmt.Fprintf(&cmds, "write %s %s\nsif %s mode 0%o\nsif %s uid 0\nsif %s gid 0\n", s.Src, s.Path, s.Path, 0o100000|uint32(s.Mode.Perm()), s.Path, s.Path)
	}
	cf, err := os.CreateTemp("", "bcd-debugfs-")
	if err != nil {
		return err
	}
	defer os.Remove(cf.Name())
	cf.WriteString(cmds.String())
	cf.Close()
	cmd := exec.Command("debugfs", "-w", "-f", cf.Name(), fmt.Sprintf("%s?offset=%d", img, debianRootOffset))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("testbed: debugfs %s: %v: %s%s", img, err, out, stderr.Bytes())
	}
	// debugfs exits 0 when a command fails; its first line on stderr is its banner.
	var errs []string
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if l != "" && !strings.HasPrefix(l, "debugfs ") {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("testbed: debugfs %s: %s", img, strings.Join(errs, "; "))
	}
	if out, err := exec.Command("e2fsck", "-fn", fmt.Sprintf("%s?offset=%d", img, debianRootOffset)).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: e2fsck after debugfs: %v: %s", err, out)
	}
	return nil
}

// PublishFile copies the file at path onto the lab's image server as name (a
// base name) and returns its URL there, its SHA-256 and its length: what
// images add registers.
func (f *Fleet) PublishFile(name, path string) (url, sha string, size int64, err error) {
	if name != filepath.Base(name) || name == "." || name == ".." {
		return "", "", 0, fmt.Errorf("testbed: publish %q: want a base name", name)
	}
	dst := filepath.Join(filepath.Dir(f.imageZst), name)
	if err := copyFile(path, dst); err != nil {
		return "", "", 0, err
	}
	sha, err = fileSHA256(dst)
	if err != nil {
		return "", "", 0, err
	}
	return f.PublishURL(name), sha, fileSize(dst), nil
}
