//go:build e2edebian

package testbed

import (
	"context"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/nodeagent/installscript"
	"github.com/better-compute/bcd/pki"
)

// debianRelease is the version scripts/release.sh builds for the install script.
const debianRelease = "0.1.0"

// kernelMessage is a stamped console line that starts in the middle of another
// line on the serial console ("…bcd.service[   60.420769] powernow_k8: …"): the
// kernel's printk interrupts whatever is being written. journald forwards the
// report's own lines with the same "[   41.429110] " stamp, and they too may start
// mid-line (after the getty's "login: "), so stripKernelMessages keeps those.
var kernelMessage = regexp.MustCompile(`([^\r\n])(\[ *\d+\.\d{6}\] [^\r\n]*)(\r?\n?)`)

// stripKernelMessages drops the kernel's messages that cut into other lines,
// with their line ends, so that the line they cut joins up again.
func stripKernelMessages(serial string) string {
	return kernelMessage.ReplaceAllStringFunc(serial, func(m string) string {
		sub := kernelMessage.FindStringSubmatch(m)
		if strings.Contains(sub[2], "bcd-lab: ") {
			return m
		}
		return sub[1]
	})
}

// debianCmdline is the Debian flavour's kernel command line in every boot, the
// kexec's included (deploy reads it from /boot/bcd-cmdline).
const debianCmdline = "root=LABEL=root rw console=ttyS0,115200 panic=30 bcd.proxy=" + ProxyURL

// TestDebianFleet is issue 8's heavier flavour, in the same lab as TestFleet: a
// Debian bookworm with systemd (DebianOS) in which bcd node runs under the spec's
// hardened bcd.service.
//
// First a PXE machine (SeaBIOS + iPXE, a virtual BMC) is deployed with machines
// deploy: ramdisk, deploy.image through the site's proxy, kexec into Debian with
// the image's own /boot/bcd-cmdline, bcd-join.service, then bcd.service; the
// machine must reach provisioned, its node ready, and the serial console must
// show systemd running bcd confined as the unit says.
//
// Then a third machine, not PXE-booted and unknown to the control plane: a VM
// booting the same Debian from its disk on the provisioning bridge, with bcd and
// its unit taken off the disk and, put on it instead, the script that
// better-compute daemon install-script generated from a release that
// scripts/release.sh built and signed (served by serve's downloads route) and a
// join token from tokens create. A oneshot runs the script with the token on its
// standard input; it downloads bcd through the site's proxy, checks it, installs
// the unit, joins and starts bcd.service, and the node shows up ready.
func TestDebianFleet(t *testing.T) {
	lab := newDebianLab(t, "ipmi_sim", "ipmitool")
	kernel, began, dir, repo, bin, ramdisk, image, sizeMiB := lab.kernel, lab.began, lab.dir, lab.repo, lab.bin, lab.ramdisk, lab.image, lab.imageMiB
	t.Logf("debian image: %d MiB (ready after %s)", sizeMiB, time.Since(began).Round(time.Second))

	// The release the third machine installs: built and signed as an operator
	// cuts one, published in the downloads directory.
	dist, releasePin := buildDebianRelease(t, bin, repo, dir)

	m := &FleetMachine{Name: "deb1", Firmware: BIOS, MAC: "52:54:00:31:00:01", DiskMiB: sizeMiB + 256}
	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: bin, Kernel: kernel, Ramdisk: ramdisk, Image: image, Log: testLog{t},
		Machines: []*FleetMachine{m},
		// The install script downloads the release from the api: an operator
		// allows it on the site's proxy beside the image server.
		Downloads: dist, ProxyAllow: []string{apiAddr}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var third *VM
	fail := func(err error) {
		t.Helper()
		var b strings.Builder
		if third != nil {
			b.WriteString(third.Tail(80))
		}
		b.WriteString(f.Diagnostics())
		t.Fatalf("%v\n%s", err, b.String())
	}

	// --- The PXE machine: deploy, kexec into Debian, node ready under systemd.
	deployAt := time.Now()
	if _, err := f.DeployImage(m); err != nil {
		fail(err)
	}
	if err := f.WaitState(ctx, m, "provisioned", 30*time.Minute); err != nil {
		fail(err)
	}
	var node FleetNode
	if err := waitFor(ctx, 5*time.Minute, func() bool {
		var ok bool
		node, ok = f.MachineNode(m)
		return ok && node.State == "ready" && node.Connected
	}); err != nil {
		fail(fmt.Errorf("machine %s: provisioned, but its node is not ready and connected: %+v", m.Name, node))
	}
	readyAt := time.Now()
	powerOn := lastPowerOn(t, m.BMC.Calls(), deployAt)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := m.BMC.WaitSerial(wctx, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`)); err != nil {
		fail(err)
	}
	serial, _ := os.ReadFile(m.BMC.Serial())
	// The kexec booted Debian's kernel with the image's own command line.
	if !strings.Contains(string(serial), "Command line: "+debianCmdline) {
		fail(fmt.Errorf("machine %s: no kernel booted with the image's /boot/bcd-cmdline (%q)", m.Name, debianCmdline))
	}
	if err := checkHardened(string(serial), installscript.UnitPath); err != nil {
		fail(fmt.Errorf("machine %s: %w", m.Name, err))
	}
	logConsole(t, m.Name, serial)
	t.Logf("machine %s: node %s ready; deploy → provisioned %s, power-on → node ready %s",
		m.Name, node.ID, readyAt.Sub(deployAt).Round(time.Second), readyAt.Sub(powerOn).Round(time.Second))

	// --- The third machine: the install script in a Debian that boots its disk.
	tokenOut, err := f.BC("tokens", "create", "--role", "node", "--pool", "scripted", "--site", "lab")
	if err != nil {
		fail(err)
	}
	token := regexp.MustCompile(`bcjt_[A-Za-z0-9_-]+`).FindString(tokenOut)
	if token == "" {
		fail(fmt.Errorf("tokens create printed no token"))
	}
	gen := exec.Command(bin.BetterCompute, "daemon", "install-script", "--pool", "scripted", "--site", "lab",
		"--gateway-url", GatewayURL, "--base-url", APIURL, "--bcd-version", debianRelease,
		"--release-manifest", filepath.Join(dist, pki.ManifestFile), "--release-pins", releasePin, "--pki", f.PKIDir())
	script, err := gen.Output()
	if err != nil {
		fail(fmt.Errorf("daemon install-script: %v", err))
	}
	seed := filepath.Join(dir, "seed")
	os.MkdirAll(seed, 0o700)
	for name, data := range map[string][]byte{"install-bcd.sh": script, "join-token": []byte(token + "\n")} {
		if err := os.WriteFile(filepath.Join(seed, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(dir, "script1.img")
	// A plain Debian, and the script, its token and the control plane's CA.
	if err := PlainDebianDisk(image, disk, []string{"/etc/bcd-lab-install"}, []DebianSeed{
		{Path: "/etc/bcd-lab-install/install-bcd.sh", Src: filepath.Join(seed, "install-bcd.sh"), Mode: 0o600},
		{Path: "/etc/bcd-lab-install/join-token", Src: filepath.Join(seed, "join-token"), Mode: 0o600},
		{Path: "/etc/bcd-lab-install/ca.crt", Src: f.ServingCACert(), Mode: 0o644},
	}); err != nil {
		t.Fatal(err)
	}
	bootAt := time.Now()
	third, err = f.StartDiskVM("script1", "52:54:00:31:00:09", disk)
	if err != nil {
		fail(err)
	}
	defer third.Stop()
	sctx, cancel2 := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel2()
	if _, err := third.WaitConsole(sctx, regexp.MustCompile(`bcd-lab: install script starting`)); err != nil {
		fail(err)
	}
	scriptAt := time.Now()
	exit, err := third.WaitConsole(sctx, regexp.MustCompile(`bcd-lab: install script exited \d+`))
	if err != nil {
		fail(err)
	}
	if !strings.HasSuffix(exit, " 0") {
		fail(fmt.Errorf("script1: %s", exit))
	}
	scripted, err := waitPoolNode(sctx, f, "scripted", 10*time.Minute)
	if err != nil {
		fail(fmt.Errorf("script1: %w", err))
	}
	scriptReady := time.Now()
	if !strings.Contains(scripted.DaemonVersion, debianRelease) {
		fail(fmt.Errorf("script1: node %s runs bcd %q, want the release's %s", scripted.ID, scripted.DaemonVersion, debianRelease))
	}
	if _, err := third.WaitConsole(sctx, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`)); err != nil {
		fail(err)
	}
	serial, _ = os.ReadFile(third.Serial)
	if err := checkHardened(string(serial), installscript.UnitPath); err != nil {
		fail(fmt.Errorf("script1: %w", err))
	}
	if strings.Contains(string(serial), token) {
		fail(fmt.Errorf("script1: the join token reached the serial console"))
	}
	logConsole(t, "script1", serial)
	t.Logf("script1: node %s ready (bcd %s); boot → script start %s, script start → node ready %s",
		scripted.ID, scripted.DaemonVersion, scriptAt.Sub(bootAt).Round(time.Second), scriptReady.Sub(scriptAt).Round(time.Second))
	t.Logf("TestDebianFleet: %s in all", time.Since(began).Round(time.Second))
}

// debianLab is what every Debian test of the lab starts from: the tools it
// needs, the binaries built from the tree, the ramdisk and the Debian image.
type debianLab struct {
	kernel, dir, repo, ramdisk, image string
	bin                               FleetBinaries
	imageMiB                          int
	began                             time.Time
}

// newDebianLab checks for the lab's tools (and more), and builds what a
// Debian test runs.
func newDebianLab(t *testing.T, more ...string) debianLab {
	t.Helper()
	l := debianLab{kernel: needLab(t)}
	for _, tool := range append([]string{"dnsmasq", "zstd", "socat", "sgdisk", "syslinux", "objcopy", "mcopy", "mkfs.vfat",
		"mkfs.ext4", "debugfs", "e2fsck", "git"}, more...) {
		testenv.NeedTool(t, tool)
	}
	l.began, l.dir, l.repo = time.Now(), t.TempDir(), repoRoot(t)
	l.bin = buildFleetBinaries(t, l.dir)
	l.ramdisk = buildRamdisk(t, l.dir)
	l.image = filepath.Join(l.dir, "debian.img")
	var err error
	if l.imageMiB, err = (DebianOS{Bcd: l.bin.Bcd, Cmdline: debianCmdline, Repo: l.repo, Log: testLog{t}}).Build(l.image); err != nil {
		t.Fatal(err)
	}
	return l
}

// buildDebianRelease builds and signs the release an install script installs, as
// an operator cuts one (scripts/release.sh with a key from release keygen), into
// dir/dist, serve's downloads directory; it returns that and the key's pin.
func buildDebianRelease(t *testing.T, bin FleetBinaries, repo, dir string) (dist, pin string) {
	t.Helper()
	dist = filepath.Join(dir, "dist")
	releaseKey := filepath.Join(dir, "release.key")
	pinOut, err := exec.Command(bin.BetterCompute, "release", "keygen", "--out", releaseKey).Output()
	if err != nil {
		t.Fatalf("release keygen: %v", err)
	}
	if err := runReleaseScript(repo, "VERSION="+debianRelease, "DIST="+dist, "BCD_RELEASE_KEYS="+releaseKey, "BCD_RELEASE_SEQUENCE=1", "BCD_RELEASE_EXPIRES=24h"); err != nil {
		t.Fatal(err)
	}
	return dist, strings.TrimSpace(string(pinOut))
}

// runReleaseScript runs scripts/release.sh with env added to the test's.
func runReleaseScript(repo string, env ...string) error {
	rel := exec.Command(filepath.Join(repo, "scripts/release.sh"))
	rel.Dir = repo
	rel.Env = append(os.Environ(), env...)
	if out, err := rel.CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/release.sh %s: %v\n%s", strings.Join(env, " "), err, out)
	}
	return nil
}

// logConsole logs the lab's own console lines (bcd-lab: …), the evidence of
// what ran in the VM.
func logConsole(t *testing.T, name string, serial []byte) {
	for _, l := range regexp.MustCompile(`bcd-lab: [^\r\n]*`).FindAll(serial, -1) {
		t.Logf("%s console: %s", name, l)
	}
}

// lastPowerOn is when the BMC last powered the machine on after since (the
// chassis program's log: "<unix time> set power 1").
func lastPowerOn(t *testing.T, calls string, since time.Time) time.Time {
	at := since
	for _, l := range strings.Split(calls, "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && f[1] == "set" && f[2] == "power" && f[3] == "1" {
			if s, err := strconv.ParseFloat(f[0], 64); err == nil {
				if ts := time.Unix(0, int64(s*1e9)); ts.After(at) {
					at = ts
				}
			}
		}
	}
	if at == since {
		t.Logf("no power on in the chassis log after the deploy; timing from the deploy")
	}
	return at
}

// capBits are the capabilities the spec's unit names, by their numbers.
var capBits = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
	"CAP_NET_ADMIN": 12, "CAP_SYS_RAWIO": 17, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22,
}

// checkHardened reads the lines bcd-lab-report printed and checks that systemd
// runs bcd.service from unitPath as the spec's unit says, and that the kernel
// confines the running process so: no_new_privs and exactly the unit's
// capability bounding set, as root.
func checkHardened(serial, unitPath string) error {
	// The kernel writes to the same console whenever it likes, also in the middle
	// of a line of ours: drop its messages (and their line ends) first.
	serial = stripKernelMessages(serial)
	show := regexp.MustCompile(`bcd-lab: systemctl show bcd: ([^\r\n]*)`).FindStringSubmatch(serial)
	proc := regexp.MustCompile(`bcd-lab: bcd process \d+: ([^\r\n]*)`).FindStringSubmatch(serial)
	active := regexp.MustCompile(`bcd-lab: systemctl is-active bcd: (\S+)`).FindStringSubmatch(serial)
	if show == nil || proc == nil || active == nil {
		return fmt.Errorf("the console lacks bcd-lab-report's lines (show %v, process %v, is-active %v)", show != nil, proc != nil, active != nil)
	}
	if active[1] != "active" {
		return fmt.Errorf("systemctl is-active bcd: %s", active[1])
	}
	props := map[string]string{}
	// systemctl show prints Key=value per property; values may hold spaces
	// (CapabilityBoundingSet), so split on the property names.
	keys := regexp.MustCompile(`(?:^|\s)(NoNewPrivileges|ProtectSystem|ProtectHome|PrivateTmp|CapabilityBoundingSet|User|RestrictNamespaces|FragmentPath|MainPID)=`)
	idx := keys.FindAllStringSubmatchIndex(show[1], -1)
	for i, m := range idx {
		end := len(show[1])
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		props[show[1][m[2]:m[3]]] = strings.TrimSpace(show[1][m[1]:end])
	}
	var want uint64
	var wantCaps []string
	for _, l := range strings.Split(installscript.BCDUnit, "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			for _, c := range strings.Fields(v) {
				b, ok := capBits[c]
				if !ok {
					return fmt.Errorf("the unit names %s, which this test does not know", c)
				}
				want |= 1 << b
				wantCaps = append(wantCaps, strings.ToLower(c))
			}
		}
	}
	for k, v := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
		"PrivateTmp": "yes", "RestrictNamespaces": "yes", "User": "", "FragmentPath": unitPath} {
		if got, ok := props[k]; !ok || got != v {
			return fmt.Errorf("systemctl show bcd: %s=%q, want %q (%s)", k, got, v, show[1])
		}
	}
	gotCaps := strings.Fields(props["CapabilityBoundingSet"])
	if len(gotCaps) != len(wantCaps) {
		return fmt.Errorf("systemctl show bcd: CapabilityBoundingSet=%s, want %s", props["CapabilityBoundingSet"], strings.Join(wantCaps, " "))
	}
	for _, c := range wantCaps {
		if !strings.Contains(" "+props["CapabilityBoundingSet"]+" ", " "+c+" ") {
			return fmt.Errorf("systemctl show bcd: CapabilityBoundingSet=%s lacks %s", props["CapabilityBoundingSet"], c)
		}
	}
	st := map[string]string{}
	for _, kv := range regexp.MustCompile(`(NoNewPrivs|CapBnd|Uid):\s+(\S+)`).FindAllStringSubmatch(proc[1], -1) {
		st[kv[1]] = kv[2]
	}
	capBnd, err := strconv.ParseUint(st["CapBnd"], 16, 64)
	if err != nil || st["NoNewPrivs"] != "1" || st["Uid"] != "0" || capBnd != want {
		return fmt.Errorf("bcd's process: %s; want NoNewPrivs 1, Uid 0, CapBnd %016x (%d capabilities)", proc[1], want, bits.OnesCount64(want))
	}
	if !strings.Contains(proc[1], "exe /usr/local/bin/bcd") {
		return fmt.Errorf("bcd's process does not run /usr/local/bin/bcd: %s", proc[1])
	}
	return nil
}

// TestDebianImage boots the Debian flavour's disk without a network under both
// firmwares (SeaBIOS through syslinux, OVMF through the unified kernel image):
// Debian's initramfs finds the root by its label and systemd starts the serial
// console's login prompt.
func TestDebianImage(t *testing.T) {
	needLab(t)
	for _, tool := range []string{"sgdisk", "syslinux", "objcopy", "mcopy", "mkfs.vfat", "mkfs.ext4"} {
		testenv.NeedTool(t, tool)
	}
	dir := t.TempDir()
	bin := buildFleetBinaries(t, dir)
	image := filepath.Join(dir, "debian.img")
	if _, err := (DebianOS{Bcd: bin.Bcd, Cmdline: debianCmdline, Repo: repoRoot(t), Log: testLog{t}}).Build(image); err != nil {
		t.Fatal(err)
	}
	for _, fw := range []string{BIOS, UEFI} {
		t.Run(fw, func(t *testing.T) {
			disk := filepath.Join(dir, fw+".img")
			if out, err := exec.Command("cp", "--sparse=always", image, disk).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v: %s", err, out)
			}
			vm, err := StartVM(nil, VMConfig{Name: "debian-" + fw, Dir: filepath.Join(dir, "vm-"+fw), Firmware: fw, MemoryMB: 1024, Disk: disk})
			if err != nil {
				t.Fatal(err)
			}
			defer vm.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`bcd-debian login:`)); err != nil {
				t.Fatalf("%v\n%s", err, vm.Tail(60))
			}
			t.Logf("%s: power-on → login prompt in %s", fw, time.Since(vm.Started).Round(100*time.Millisecond))
		})
	}
}

// TestDebianKernelMessageStrip: a printk line dropped into one of the report's
// lines, at its end or in its middle, leaves the line as the oneshot wrote it, and
// the report's lines journald stamps stay.
func TestDebianKernelMessageStrip(t *testing.T) {
	for in, want := range map[string]string{
		"[   41.429110] bcd-lab-report[343]: bcd-lab: systemctl show bcd: FragmentPath=/etc/systemd/system/bcd.service[   60.420769] powernow_k8: Power state transitions not supported\r\n\nnext": "[   41.429110] bcd-lab-report[343]: bcd-lab: systemctl show bcd: FragmentPath=/etc/systemd/system/bcd.service\nnext",
		"bcd-lab: x: A=1 B[    1.000000] msg\r\n=2\n":                                                        "bcd-lab: x: A=1 B=2\n",
		"[   41.921143] bcd-lab-report[343]: bcd-lab: systemctl is-active bcd: active\r\n":                   "[   41.921143] bcd-lab-report[343]: bcd-lab: systemctl is-active bcd: active\r\n",
		"bcd-debian login: [   35.845653] bcd-lab-report[317]: bcd-lab: systemctl show bcd: MainPID=313\r\n": "bcd-debian login: [   35.845653] bcd-lab-report[317]: bcd-lab: systemctl show bcd: MainPID=313\r\n",
	} {
		if got := stripKernelMessages(in); got != want {
			t.Errorf("%q → %q, want %q", in, got, want)
		}
	}
}

// waitReadyNode waits for the node of role node that match picks to be ready
// and connected, and returns it (as last seen, with the error, when it is
// not); what names it in the error.
func waitReadyNode(ctx context.Context, f *Fleet, what string, match func(FleetNode) bool, timeout time.Duration) (FleetNode, error) {
	var last FleetNode
	err := waitFor(ctx, timeout, func() bool {
		nodes, _ := f.Nodes()
		for _, n := range nodes {
			if n.Role == "node" && match(n) {
				last = n
				return n.State == "ready" && n.Connected
			}
		}
		return false
	})
	if err != nil {
		return last, fmt.Errorf("no ready, connected node %s (last %+v)", what, last)
	}
	return last, nil
}

// waitPoolNode is waitReadyNode for the node in pool.
func waitPoolNode(ctx context.Context, f *Fleet, pool string, timeout time.Duration) (FleetNode, error) {
	return waitReadyNode(ctx, f, "in pool "+pool, func(n FleetNode) bool { return n.Pool == pool }, timeout)
}
