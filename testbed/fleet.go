package testbed

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// The fleet's two networks. The management network holds the control plane and an
// image server; the provisioning network (a bridge) holds the site agent, the
// site's own DHCP server and the machines. The machines have no route off the
// bridge: the site agent's HTTP proxy is their only way to the gateway and images.
const (
	MgmtCP       = "10.10.0.1" // better-compute serve and the image server
	MgmtSite     = "10.10.0.2" // the site agent's leg on the management network
	ProvSite     = "10.20.0.2" // the site agent on the bridge: boot servers, proxy
	ProvDHCP     = "10.20.0.3" // the site's own DHCP server
	proxyListen  = ProvSite + ":3128"
	imageAddr    = MgmtCP + ":8090"
	apiAddr      = MgmtCP + ":8443"
	gatewayAddr  = MgmtCP + ":8444"
	bootHTTPAddr = ProvSite + ":8080"
	// ProxyURL is the site agent's proxy as the machines' kernels are told it.
	ProxyURL = "http://" + proxyListen
)

// FleetBinaries are the programs the fleet runs, built by the caller.
type FleetBinaries struct {
	Bcd, BetterCompute, BcxIPMI string
}

// FleetMachine is one machine of the lab: a VM with a virtual BMC.
type FleetMachine struct {
	Name     string
	Firmware string // BIOS or UEFI
	MAC      string
	TPM      bool
	DiskMiB  int // default 1024
	// NVRAMBootOrder: the firmware's variables decide what boots (VMConfig.NVRAMBootOrder).
	NVRAMBootOrder bool
	IP             string
	BMC            *VBMC
}

// Fleet is the whole lab: namespaces, control plane, site agent, site DHCP, image
// server, BMCs and VMs. Close stops everything it started and deletes the
// namespaces.
type Fleet struct {
	Dir      string
	Bin      FleetBinaries
	Kernel   string // the ramdisk's kernel (Debian's vmlinuz)
	Ramdisk  string // the ramdisk's initramfs (make initramfs)
	Image    string // the OS image to deploy, raw
	Log      io.Writer
	Machines []*FleetMachine
	// Downloads, when set, is serve's --downloads-dir: the release archives an
	// install script fetches from {api}/downloads/….
	Downloads string
	// ProxyAllow are destinations (host:port) the site's proxy lets machines
	// reach besides the gateway, the boot server and the image server, such as
	// the api for an install script's downloads.
	ProxyAllow []string
	// ServeArgs are more flags for better-compute serve (--release-pins).
	ServeArgs []string

	mgmt, site, dhcpNS *Netns
	serve, siteAgent   *Process
	dhcp               *Process
	imageSrv           *http.Server
	imageZst           string
	imageSHA           string
	imageSize          int64
	cgroup             string
	pki                string
	tokenFile          string
	extra              []*Process // the disk VMs' swtpm
}

func (f *Fleet) logf(format string, args ...any) {
	if f.Log != nil {
		fmt.Fprintf(f.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.0")}, args...)...)
	}
}

// Start builds the lab and starts every service; the machines are registered but
// powered off.
func (f *Fleet) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	id := os.Getpid() % 100000
	if f.mgmt, err = NewNetns(fmt.Sprintf("bcdmgmt%d", id)); err != nil {
		return err
	}
	if f.site, err = NewNetns(fmt.Sprintf("bcdsite%d", id)); err != nil {
		return err
	}
	if f.dhcpNS, err = NewNetns(fmt.Sprintf("bcdsdhcp%d", id)); err != nil {
		return err
	}
	steps := []func() error{
		func() error { return Veth(f.mgmt, "mgmt0", MgmtCP+"/24", f.site, "mgmt0", MgmtSite+"/24") },
		func() error { return f.site.AddBridge("br0", ProvSite+"/24") },
		func() error { return Veth(f.site, "vdhcp", "", f.dhcpNS, "eth0", ProvDHCP+"/24") },
		func() error { return f.site.Run("ip", "link", "set", "vdhcp", "master", "br0") },
		func() error { return f.dhcpNS.Run("ip", "addr", "add", "fd00:20::3/64", "dev", "eth0", "nodad") },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	hosts := map[string]string{}
	for i, m := range f.Machines {
		if m.IP == "" {
			m.IP = fmt.Sprintf("10.20.0.%d", 101+i)
		}
		hosts[m.MAC] = m.IP
	}
	f.logf("networks: management %s/24, provisioning bridge %s/24 (site DHCP %s)", MgmtCP, ProvSite, ProvDHCP)
	if f.dhcp, err = (SiteDHCP{Iface: "eth0", Range: "10.20.0.100,10.20.0.199", Hosts: hosts, Dir: filepath.Join(f.Dir, "site-dhcp"), IPv6RA: true}).Start(f.dhcpNS); err != nil {
		return err
	}
	if err := f.startImageServer(); err != nil {
		return err
	}
	if err := f.startControlPlane(ctx); err != nil {
		return err
	}
	if err := f.startSite(ctx); err != nil {
		return err
	}
	for i, m := range f.Machines {
		if err := f.addMachine(i, m); err != nil {
			return err
		}
	}
	return nil
}

// startImageServer compresses the image with zstd and serves it on the management
// network, where only the site agent's proxy reaches it.
func (f *Fleet) startImageServer() error {
	f.imageZst = filepath.Join(f.Dir, "images", filepath.Base(f.Image)+".zst")
	os.MkdirAll(filepath.Dir(f.imageZst), 0o755)
	if out, err := exec.Command("zstd", "-q", "-f", "-3", "-T0", f.Image, "-o", f.imageZst).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: zstd: %v: %s", err, out)
	}
	b, err := os.Open(f.imageZst)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(h, b)
	b.Close()
	if err != nil {
		return err
	}
	f.imageSHA, f.imageSize = hex.EncodeToString(h.Sum(nil)), n
	var ln net.Listener
	if err := f.mgmt.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", imageAddr)
		return err
	}); err != nil {
		return err
	}
	f.imageSrv = &http.Server{Handler: http.FileServer(http.Dir(filepath.Dir(f.imageZst))), ReadHeaderTimeout: 10 * time.Second}
	go f.imageSrv.Serve(ln)
	f.logf("image server: http://%s/%s (%d MB zstd, sha256 %s…)", imageAddr, filepath.Base(f.imageZst), n>>20, f.imageSHA[:12])
	return nil
}

// BC runs an operator command against the control plane, from the management
// network.
func (f *Fleet) BC(args ...string) (string, error) {
	return RunBC(f.mgmt, f.Bin.BetterCompute, "https://"+apiAddr, f.pki, f.tokenFile, args...)
}

// RunBC runs the operator CLI bin inside ns against the api at server, with
// the PKI directory and the operator token file: the testbed's and simlab's
// one way to run an operator command. stdout is returned; a failure carries
// stderr.
func RunBC(ns *Netns, bin, server, pki, tokenFile string, args ...string) (string, error) {
	cmd := ns.Command(bin, append(args, "--token-file", tokenFile)...)
	cmd.Env = append(os.Environ(), "BETTER_COMPUTE_SERVER="+server, "BETTER_COMPUTE_PKI="+pki)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("better-compute %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (f *Fleet) startControlPlane(ctx context.Context) error {
	f.pki = filepath.Join(f.Dir, "pki")
	f.tokenFile = filepath.Join(f.Dir, "operator-token")
	if out, err := exec.Command(f.Bin.BetterCompute, "pki", "init", f.pki).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: pki init: %v: %s", err, out)
	}
	if err := f.StartControlPlane(ctx); err != nil {
		return err
	}
	f.logf("control plane: api https://%s, gateway https://%s", apiAddr, gatewayAddr)
	proxy := []string{"sites", "set-proxy", "lab", "--listen", proxyListen, "--allow", imageAddr}
	for _, d := range f.ProxyAllow {
		proxy = append(proxy, "--allow", d)
	}
	for _, args := range [][]string{{"sites", "create", "lab"}, proxy} {
		if _, err := f.BC(args...); err != nil {
			return err
		}
	}
	return nil
}

// StartControlPlane starts better-compute serve on the lab's data (again, after
// StopControlPlane) and waits until its api answers.
func (f *Fleet) StartControlPlane(ctx context.Context) error {
	args := []string{"serve", "--pki", f.pki, "--data", filepath.Join(f.Dir, "cp"),
		"--listen", apiAddr, "--gateway-listen", gatewayAddr, "--operator-token-file", f.tokenFile}
	if f.Downloads != "" {
		args = append(args, "--downloads-dir", f.Downloads)
	}
	args = append(args, f.ServeArgs...)
	cmd := f.mgmt.Command(f.Bin.BetterCompute, args...)
	var err error
	if f.serve, err = StartProcess("better-compute serve", cmd, filepath.Join(f.Dir, "logs", "serve.log")); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool {
		_, err := os.Stat(f.tokenFile)
		if err != nil {
			return false
		}
		_, err = f.BC("sites", "list")
		return err == nil
	}); err != nil {
		return fmt.Errorf("testbed: better-compute serve did not start: %w\n%s", err, f.serve.Tail(20))
	}
	return nil
}

// StopControlPlane stops better-compute serve, as a crash or an upgrade would.
func (f *Fleet) StopControlPlane() { f.serve.Stop(15 * time.Second) }

// RestartControlPlane stops better-compute serve and starts it again on the same
// data, as an operator's upgrade or a crash would.
func (f *Fleet) RestartControlPlane(ctx context.Context) error {
	f.StopControlPlane()
	return f.StartControlPlane(ctx)
}

func (f *Fleet) startSite(ctx context.Context) error {
	dir := filepath.Join(f.Dir, "site")
	for _, d := range []string{"etc", "data", "tftp", "ramdisk", "plugins"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, b := range []string{"undionly.kpxe", "ipxe.efi", "snponly.efi"} {
		if err := copyFile("/usr/lib/ipxe/"+b, filepath.Join(dir, "tftp", b)); err != nil {
			return err
		}
	}
	if err := copyFile(f.Kernel, filepath.Join(dir, "ramdisk", "vmlinuz")); err != nil {
		return err
	}
	if err := copyFile(f.Ramdisk, filepath.Join(dir, "ramdisk", "initrd")); err != nil {
		return err
	}
	// The BMC plugin and its pin, as the install script would lay them down.
	plugin := filepath.Join(dir, "plugins", "bcx-ipmi")
	if err := copyFile(f.Bin.BcxIPMI, plugin); err != nil {
		return err
	}
	os.Chmod(plugin, 0o755)
	sum, err := fileSHA256(plugin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "pins"), []byte(sum+"  bcx-ipmi\n"), 0o644); err != nil {
		return err
	}
	// The site agent's own cgroup, as a service manager's Delegate= would give it;
	// bcd site creates the plugins' cgroups below it. Only on a cgroup v2 that
	// offers memory and pids: a hybrid host binds them to cgroup v1, and there the
	// lab leaves [plugins] cgroup out (bcd site then warns that plugins run unlimited).
	pluginsCgroup := ""
	if cgroupV2Limits() {
		f.cgroup = fmt.Sprintf("/sys/fs/cgroup/bcdlab%d", os.Getpid()%100000)
		if err := os.Mkdir(f.cgroup, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("testbed: the site agent's cgroup: %w", err)
		}
		pluginsCgroup = fmt.Sprintf("cgroup = %q\n", f.cgroup+"/plugins")
	} else {
		f.logf("cgroup v2 here offers no memory and pids controllers: plugins run without a cgroup of their own")
	}

	pins, err := exec.Command(f.Bin.BetterCompute, "pki", "pins", f.pki).Output()
	if err != nil {
		return err
	}
	conf := filepath.Join(dir, "etc", "config.toml")
	cfg := fmt.Sprintf(`gateway_url = "https://%s"
site = "lab"
%sdata_dir = %q
socket_path = %q

[boot]
listen = %q
url = "http://%s"
kernel = "http://%s/ramdisk/vmlinuz"
initrd = "http://%s/ramdisk/initrd"
cmdline = "console=ttyS0,115200"
server_ip = %q
proxy_dhcp = true
tftp = "%s:69"
tftp_root = %q
interface = "br0"
ramdisk_dir = %q

[plugins]
dir = %q
%s`, gatewayAddr, pins, filepath.Join(dir, "data"), filepath.Join(dir, "bcd.sock"),
		bootHTTPAddr, bootHTTPAddr, bootHTTPAddr, bootHTTPAddr, ProvSite, ProvSite,
		filepath.Join(dir, "tftp"), filepath.Join(dir, "ramdisk"), filepath.Join(dir, "plugins"), pluginsCgroup)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(f.pki, "join-encryption.jwk"), filepath.Join(dir, "etc", "join-encryption.jwk")); err != nil {
		return err
	}
	token, err := f.BC("tokens", "create", "--pool", "lab", "--site", "lab", "--role", "site")
	if err != nil {
		return err
	}
	join := f.site.Command(f.Bin.Bcd, "join", "--role", "site", "--config", conf)
	join.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+strings.TrimSpace(token))
	if out, err := join.CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: bcd join --role site: %v: %s", err, out)
	}
	return f.StartSiteAgent(ctx)
}

// StartSiteAgent starts bcd site (again) and waits until it is connected.
func (f *Fleet) StartSiteAgent(ctx context.Context) error {
	if err := f.StartSiteAgentOffline(ctx); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool {
		out, _ := f.BC("nodes", "list", "-o", "json")
		var nodes []struct {
			Role      string `json:"role"`
			Connected bool   `json:"connected"`
		}
		json.Unmarshal([]byte(out), &nodes)
		for _, n := range nodes {
			if n.Role == protocol.RoleSite && n.Connected {
				return true
			}
		}
		return false
	}); err != nil {
		return fmt.Errorf("testbed: bcd site did not connect: %w\n%s", err, f.siteAgent.Tail(30))
	}
	f.logf("site agent: connected; boot servers on %s (proxyDHCP :67/:4011, TFTP :69, HTTP :8080), proxy %s", ProvSite, proxyListen)
	return nil
}

// StartSiteAgentOffline starts bcd site (again) and waits only until it has
// started serving, which it does without the gateway: from the spec it kept.
func (f *Fleet) StartSiteAgentOffline(ctx context.Context) error {
	conf := filepath.Join(f.Dir, "site", "etc", "config.toml")
	logPath := filepath.Join(f.Dir, "logs", "site.log")
	before := int64(0)
	if fi, err := os.Stat(logPath); err == nil {
		before = fi.Size()
	}
	var err error
	if f.siteAgent, err = StartProcess("bcd site", f.site.CommandSameMounts(f.Bin.Bcd, "site", "--config", conf), logPath); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool {
		b, _ := os.ReadFile(logPath)
		return int64(len(b)) > before && bytes.Contains(b[before:], []byte("bcd site started"))
	}); err != nil {
		return fmt.Errorf("testbed: bcd site did not start: %w\n%s", err, f.siteAgent.Tail(30))
	}
	return nil
}

// SiteAgent is the running bcd site.
func (f *Fleet) SiteAgent() *Process { return f.siteAgent }

// StopSiteAgent stops bcd site.
func (f *Fleet) StopSiteAgent() { f.siteAgent.Stop(15 * time.Second) }

func (f *Fleet) addMachine(i int, m *FleetMachine) error {
	if m.Firmware == "" {
		m.Firmware = BIOS
	}
	disk := filepath.Join(f.Dir, "vms", m.Name, "disk.img")
	os.MkdirAll(filepath.Dir(disk), 0o755)
	size := m.DiskMiB
	if size == 0 {
		size = 1024
	}
	if err := os.Truncate(disk, int64(size)<<20); err != nil {
		if f, err2 := os.Create(disk); err2 == nil {
			f.Close()
			err = os.Truncate(disk, int64(size)<<20)
		}
		if err != nil {
			return err
		}
	}
	tap := fmt.Sprintf("tap%d", i)
	if err := f.site.AddTap(tap, "br0"); err != nil {
		return err
	}
	m.BMC = &VBMC{Name: m.Name, Dir: filepath.Join(f.Dir, "bmc", m.Name), Port: 6231 + i, Netns: f.site, TPM: m.TPM,
		VM: &VMConfig{Name: m.Name, Firmware: m.Firmware, MemoryMB: 1024, Tap: tap, MAC: m.MAC, Disk: disk, NVRAMBootOrder: m.NVRAMBootOrder}}
	if err := m.BMC.Start(); err != nil {
		return err
	}
	user, pass := m.BMC.User()
	pw := filepath.Join(f.Dir, "bmc", m.Name, "password")
	if err := os.WriteFile(pw, []byte(pass), 0o600); err != nil {
		return err
	}
	args := []string{"machines", "add", "--site", "lab", "--name", m.Name, "--mac", m.MAC,
		"--bmc-address", "127.0.0.1", "--bmc-port", fmt.Sprint(6231 + i), "--bmc-user", user,
		"--bmc-password-file", pw, "--bmc-cipher-suite", "3"}
	if m.Firmware == UEFI {
		args = append(args, "--efi")
	}
	if _, err := f.BC(args...); err != nil {
		return err
	}
	f.logf("machine %s: %s, MAC %s, BMC 127.0.0.1:%d (ipmi_sim)%s", m.Name, m.Firmware, m.MAC, 6231+i, map[bool]string{true: ", swtpm"}[m.TPM])
	return nil
}

// Deploy starts the deployment of the lab's image to a machine, as an operator does.
func (f *Fleet) Deploy(m *FleetMachine, extra ...string) (string, error) {
	imageSize := fileSize(f.Image)
	args := append([]string{"machines", "deploy", m.Name,
		"--image", "http://" + imageAddr + "/" + filepath.Base(f.imageZst),
		"--sha256", f.imageSHA, "--size", fmt.Sprint(f.imageSize), "--format", "raw.zst",
		"--image-size", fmt.Sprint(imageSize),
		"--cmdline", "console=ttyS0,115200 panic=30 bcd.proxy=http://" + proxyListen}, extra...)
	return f.BC(args...)
}

// MachineState reads a machine's state from machines list.
func (f *Fleet) MachineState(m *FleetMachine) (state, reason string, err error) {
	out, err := f.BC("machines", "show", m.Name, "-o", "json")
	if err != nil {
		return "", "", err
	}
	var v struct {
		State       string `json:"state"`
		StateReason string `json:"state_reason"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return "", "", fmt.Errorf("machines show -o json: %w: %s", err, out)
	}
	return v.State, v.StateReason, nil
}

// WaitState waits until the machine is in state, failing early on state failed.
func (f *Fleet) WaitState(ctx context.Context, m *FleetMachine, want string, timeout time.Duration) error {
	var last, reason string
	err := waitFor(ctx, timeout, func() bool {
		s, r, err := f.MachineState(m)
		if err == nil {
			if s != last {
				f.logf("machine %s: %s %s", m.Name, s, r)
			}
			last, reason = s, r
		}
		return s == want || (s == "failed" && want != "failed")
	})
	if last == "failed" && want != "failed" {
		return fmt.Errorf("machine %s failed: %s", m.Name, reason)
	}
	if err != nil {
		return fmt.Errorf("machine %s: not %s within %s (last %s %s): %w", m.Name, want, timeout, last, reason, err)
	}
	return nil
}

// WaitNodeBack waits until the machine's node has a new session after a reboot.
func (f *Fleet) WaitNodeBack(ctx context.Context, m *FleetMachine, timeout time.Duration) error {
	node, session := f.node(m)
	return f.waitNodeSession(ctx, m, node, session, timeout)
}

// node returns the id and open session of the machine's installed OS's node.
func (f *Fleet) node(m *FleetMachine) (id string, session int64) {
	out, err := f.BC("machines", "show", m.Name, "-o", "json")
	if err != nil {
		return "", 0
	}
	var v struct {
		Node string `json:"node"`
	}
	json.Unmarshal([]byte(out), &v)
	out, err = f.BC("nodes", "list", "-o", "json")
	if err != nil {
		return v.Node, 0
	}
	var nodes []struct {
		ID        string `json:"id"`
		Connected bool   `json:"connected"`
		SessionID int64  `json:"session_id"`
	}
	json.Unmarshal([]byte(out), &nodes)
	for _, n := range nodes {
		if n.ID == v.Node && n.Connected {
			return n.ID, n.SessionID
		}
	}
	return v.Node, 0
}

// Diagnostics returns what a failing test prints: every log's tail and each
// machine's console.
func (f *Fleet) Diagnostics() string {
	var b strings.Builder
	for _, p := range []*Process{f.serve, f.siteAgent, f.dhcp} {
		if p != nil {
			b.WriteString(p.Tail(40))
		}
	}
	for _, m := range f.Machines {
		if m.BMC != nil {
			b.WriteString(m.BMC.Tail(40))
		}
		if out, err := f.BC("machines", "events", m.Name); err == nil {
			fmt.Fprintf(&b, "--- machines events %s\n%s\n", m.Name, out)
		}
	}
	return b.String()
}

// Close stops every process the lab started, by PID, and deletes its namespaces.
func (f *Fleet) Close() {
	for _, m := range f.Machines {
		if m.BMC != nil {
			m.BMC.Stop()
		}
	}
	for _, p := range f.extra {
		p.Stop(5 * time.Second)
	}
	if f.siteAgent != nil {
		f.siteAgent.Stop(10 * time.Second)
	}
	if f.serve != nil {
		f.serve.Stop(10 * time.Second)
	}
	if f.dhcp != nil {
		f.dhcp.Stop(5 * time.Second)
	}
	if f.imageSrv != nil {
		f.imageSrv.Close()
	}
	if f.cgroup != "" {
		removeCgroup(f.cgroup)
	}
	for _, ns := range []*Netns{f.dhcpNS, f.site, f.mgmt} {
		if ns != nil {
			ns.Close()
		}
	}
}

// cgroupV2Limits reports whether /sys/fs/cgroup is a cgroup v2 root offering the
// memory and pids controllers.
func cgroupV2Limits() bool {
	b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	has := func(c string) bool {
		for _, x := range f {
			if x == c {
				return true
			}
		}
		return false
	}
	return has("memory") && has("pids")
}

// removeCgroup removes a cgroup tree bottom-up (only empty cgroups can go).
func removeCgroup(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroup(filepath.Join(dir, e.Name()))
		}
	}
	os.Remove(dir)
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func fileSHA256(path string) (string, error) {
	b, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer b.Close()
	h := sha256.New()
	if _, err := io.Copy(h, b); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
