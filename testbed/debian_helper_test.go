//go:build e2edebian

package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
)

// oldScriptState is what an install script from between 0ba2a79 and 8870b8d
// left on an unprivileged host (spec "Running bcd node unprivileged", step
// 6): the bcd system account in the tss group and the udev rule that gave
// tss the TPM. It runs once, before bcd-lab-install.service, and says what it
// made on the console.
const oldScriptState = `#!/bin/sh
set -eu
getent group tss >/dev/null || groupadd --system tss
id bcd >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /var/lib/bcd --shell /usr/sbin/nologin bcd
gpasswd -a bcd tss >/dev/null
mkdir -p /etc/udev/rules.d
printf 'KERNEL=="tpmrm0", GROUP="tss", MODE="0660"\n' >/etc/udev/rules.d/60-bcd-tpm.rules
touch /var/lib/bcd-lab-old-script.done
echo "bcd-lab: old script's state: bcd groups $(id -Gn bcd | tr ' ' ','), udev rule $(cat /etc/udev/rules.d/60-bcd-tpm.rules)"
`

const oldScriptUnit = `[Unit]
Description=bcd lab: the state an older --unprivileged install script left (bcd in tss, the udev rule)
ConditionPathExists=!/var/lib/bcd-lab-old-script.done
Before=bcd-lab-install.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/bcd-lab-old-script
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
`

// helperStatus prints, one line each, how bcd.service's and
// bcd-helper.service's main processes run (/proc/<pid>/status), the bcd
// account, which of the node's open files are a TPM, the old script's
// leftovers and node.key's first line.
const helperStatus = `pid=$(systemctl show -p MainPID --value bcd.service)
hpid=$(systemctl show -p MainPID --value bcd-helper.service)
echo "states: $(systemctl is-active bcd-helper.service) $(systemctl is-active bcd.service)"
echo "node: $(grep -E '^(Uid|Gid|CapEff|CapPrm):' /proc/"$pid"/status | tr '\t\n' '  ')exe $(readlink /proc/"$pid"/exe)"
echo "helper: $(grep -E '^(Uid|CapEff):' /proc/"$hpid"/status | tr '\t\n' '  ')exe $(readlink /proc/"$hpid"/exe)"
echo "account: uid $(id -u bcd) groups $(id -Gn bcd | tr ' ' ',')"
echo "node fds: $(ls -l /proc/"$pid"/fd | wc -l); tpm: $(ls -l /proc/"$pid"/fd | grep -E '/dev/tpm(rm)?[0-9]' | tr '\n' ' ')."
echo "udev rule: $(if [ -e /etc/udev/rules.d/60-bcd-tpm.rules ]; then echo present; else echo absent; fi)"
echo "node.key: $(head -n1 /var/lib/bcd/node.key)"
echo "slots: $(stat -c '%n %U:%G %a' /usr/local/lib/bcd /usr/local/lib/bcd/* 2>&1 | tr '\n' ';')"
`

// TestDebianHelper is issue 15's proof in the Debian flavour: one machine
// with a TPM (swtpm), installed by the script generated with --unprivileged
// --attestor tpm --release-pins from a release scripts/release.sh built and
// signed, over the state an older script left (bcd in tss, the udev rule).
// It checks that the script's upgrade of that state took bcd out of tss and
// deleted the rule; that bcd.service runs as bcd with no effective
// capabilities and bcd-helper.service as root; that the node is ready with
// its key in the TPM while the node process has no TPM open; that bcd doctor
// passes its helper checks; that a copy of bcd run as bcd from another path
// is refused by the helper; that a rollout updates the node through the
// helper into root's slots; and that nodes reboot reboots it through the
// helper. The machine's view comes from TestDebianSelfUpdate's probe.
func TestDebianHelper(t *testing.T) {
	lab := newDebianLab(t, "swtpm", "shellcheck")
	kernel, began, dir, repo, bin, ramdisk, image := lab.kernel, lab.began, lab.dir, lab.repo, lab.bin, lab.ramdisk, lab.image
	probe := filepath.Join(dir, "bcd-lab-probe")
	old := filepath.Join(dir, "bcd-lab-old-script")
	for p, body := range map[string]string{probe: probeScript, old: oldScriptState} {
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("shellcheck", "-s", "sh", p).CombinedOutput(); err != nil {
			t.Fatalf("shellcheck %s: %v\n%s", filepath.Base(p), err, out)
		}
	}
	k1, pin1 := releaseKey(t, bin, dir, "k1")
	downloads := filepath.Join(dir, "downloads")
	if err := os.MkdirAll(downloads, 0o755); err != nil {
		t.Fatal(err)
	}
	r010, err := buildLabRelease(repo, bin.BetterCompute, dir, downloads, "0.1.0", 1, "", "24h", k1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("release 0.1.0 built and signed (%s)", time.Since(began).Round(time.Second))

	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: bin, Kernel: kernel, Ramdisk: ramdisk, Image: image, Log: testLog{t},
		Downloads: downloads, ProxyAllow: []string{apiAddr}, ServeArgs: []string{"--release-pins", pin1}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	m := &updVM{name: "hlp1", mac: "52:54:00:31:00:31"}
	state := filepath.Join(dir, "hlp1-state")
	failing := false
	fail := func(err error) {
		t.Helper()
		var s strings.Builder
		if m.vm != nil {
			s.WriteString(m.vm.Tail(80))
			serial, _ := os.ReadFile(m.vm.Serial)
			lines := regexp.MustCompile(`bcd-lab: [^\r\n]*`).FindAllString(stripKernelMessages(string(serial)), -1)
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			fmt.Fprintf(&s, "--- %s: %d boot(s); its last %d bcd-lab lines:\n%s\n", m.name,
				strings.Count(string(serial), "Linux version "), len(lines), strings.Join(lines, "\n"))
			// The services' own logs, when the probe still runs commands.
			select {
			case <-m.vm.Exited():
				failing = true
				s.WriteString("--- the VM has exited: no journal\n")
			default:
			}
			if !failing {
				failing = true
				lctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
				out, rc, lerr := tryOnVM(lctx, f, m, "journalctl -u bcd -u bcd-helper -n 200 --no-pager -o short-iso", 2*time.Minute)
				cancel()
				fmt.Fprintf(&s, "--- journalctl -u bcd -u bcd-helper (exit %d, %v):\n%s\n", rc, lerr, strings.Join(out, "\n"))
			}
		}
		s.WriteString(f.Diagnostics())
		if out, err := f.BC("rollouts", "list"); err == nil {
			fmt.Fprintf(&s, "--- rollouts list\n%s\n", out)
		}
		t.Fatalf("%v\n%s", err, s.String())
	}
	bc := func(args ...string) string {
		t.Helper()
		out, err := f.BC(args...)
		if err != nil {
			fail(err)
		}
		return out
	}
	// 0.1.1, the rollout's release, builds while the machine boots.
	type built struct {
		rel labRelease
		err error
	}
	later := make(chan built, 1)
	go func() {
		r, err := buildLabRelease(repo, bin.BetterCompute, dir, downloads, "0.1.1", 2, "", "24h", k1)
		later <- built{r, err}
	}()

	// The TPM's EK, read before the boot and enrolled: the script joins with
	// --attestor tpm, no token anywhere.
	ek, err := ReadSWTPMEK(state)
	if err != nil {
		fail(err)
	}
	bc("tpm", "enroll", "--site", "lab", "--pool", "helper", "--ek-sha256", ek)
	bc("pools", "set-policy", "helper", "--join-attestors", "tpm")
	script, err := installScript(bin, f, "helper", r010, pin1, "--unprivileged", "--attestor", "tpm")
	if err != nil {
		fail(err)
	}
	if !strings.Contains(script, "[helper]") {
		fail(fmt.Errorf("the --unprivileged script adds no [helper] section"))
	}
	md := filepath.Join(dir, "seed", m.name)
	os.MkdirAll(md, 0o700)
	for name, data := range map[string]string{"install-bcd.sh": script, "url": f.PublishURL("lab/"+m.name) + "\n",
		"name": m.name + "\n", "probe-unit": probeUnit, "old-unit": oldScriptUnit} {
		if err := os.WriteFile(filepath.Join(md, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(dir, m.name+".img")
	const wants = "/etc/systemd/system/multi-user.target.wants/"
	if err := PlainDebianDisk(image, disk, []string{"/etc/bcd-lab-install", "/etc/bcd-lab-probe"}, []DebianSeed{
		{Path: "/etc/bcd-lab-install/install-bcd.sh", Src: filepath.Join(md, "install-bcd.sh"), Mode: 0o600},
		{Path: "/etc/bcd-lab-install/ca.crt", Src: f.ServingCACert(), Mode: 0o644},
		{Path: "/etc/bcd-lab-probe/name", Src: filepath.Join(md, "name"), Mode: 0o644},
		{Path: "/etc/bcd-lab-probe/url", Src: filepath.Join(md, "url"), Mode: 0o644},
		{Path: "/usr/local/sbin/bcd-lab-probe", Src: probe, Mode: 0o755},
		{Path: "/etc/systemd/system/bcd-lab-probe.service", Src: filepath.Join(md, "probe-unit"), Mode: 0o644},
		{Path: wants + "bcd-lab-probe.service", Link: "/etc/systemd/system/bcd-lab-probe.service"},
		{Path: "/usr/local/sbin/bcd-lab-old-script", Src: old, Mode: 0o755},
		{Path: "/etc/systemd/system/bcd-lab-old-script.service", Src: filepath.Join(md, "old-unit"), Mode: 0o644},
		{Path: wants + "bcd-lab-old-script.service", Link: "/etc/systemd/system/bcd-lab-old-script.service"},
	}); err != nil {
		t.Fatal(err)
	}
	m.bootAt = time.Now()
	if m.vm, err = f.StartDiskVMWith(DiskVM{Name: m.name, MAC: m.mac, Disk: disk, TPMState: state, Reboots: true}); err != nil {
		fail(err)
	}
	defer m.vm.Stop()
	wctx, cancel := context.WithTimeout(ctx, 45*time.Minute)
	defer cancel()

	// --- The old script's state, then the install over it.
	oldState, err := m.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: old script's state: [^\r\n]*`))
	if err != nil {
		fail(err)
	}
	if !regexp.MustCompile(`groups \S*\btss\b`).MatchString(oldState) || !strings.Contains(oldState, `GROUP="tss"`) {
		fail(fmt.Errorf("the seeded old state is not bcd in tss with the udev rule: %s", oldState))
	}
	exit, err := m.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: install script exited \d+`))
	if err != nil {
		fail(err)
	}
	if !strings.HasSuffix(exit, " 0") {
		fail(fmt.Errorf("%s: %s", m.name, exit))
	}
	n, err := waitPoolNode(wctx, f, "helper", 15*time.Minute)
	if err != nil {
		fail(err)
	}
	m.node = n.ID
	if !pki.SameVersion(n.DaemonVersion, "0.1.0") {
		fail(fmt.Errorf("node %+v, want bcd 0.1.0", n))
	}
	t.Logf("%s: %s; node %s ready in pool helper on bcd %s; boot → node ready %s", m.name, strings.TrimPrefix(oldState, "bcd-lab: "),
		m.node, n.DaemonVersion, time.Since(m.bootAt).Round(time.Second))

	// --- How both processes run; the old script's state is gone.
	bcdUID := checkHelperNode(t, wctx, f, m, "after the install", fail)

	// bcd doctor, as root: the helper's chains hold on this Debian.
	out, _ := runOnVM(t, wctx, f, m, "bcd doctor --config /etc/bcd/config.toml", fail)
	doctor := strings.Join(out, "\n")
	if !strings.Contains(doctor, "helper: ok: the helper's config, socket directory and slots path are root's") ||
		!strings.Contains(doctor, "tpm: ok: the node key is in the TPM") || !strings.Contains(doctor, "config: ok: ") {
		fail(fmt.Errorf("bcd doctor as root on the helper node:\n%s", doctor))
	}
	t.Logf("bcd doctor: %s", strings.Join(out, " | "))

	// --- A copy of bcd run as bcd from another path: the helper refuses it.
	copyCmd := `cp /usr/local/bin/bcd /tmp/bcd-copy && chmod 0755 /tmp/bcd-copy
since=$(date '+%Y-%m-%d %H:%M:%S')
timeout 90 runuser -u bcd -- /tmp/bcd-copy node --config /etc/bcd/config.toml >/run/bcd-copy.log 2>&1
echo "copy exited $?"
tail -n 12 /run/bcd-copy.log
i=0
until journalctl -u bcd-helper --since "$since" -o cat --no-pager | grep -q 'refused a caller' || [ $i -ge 40 ]; do sleep 0.5; i=$((i + 1)); done
journalctl -u bcd-helper --since "$since" -o cat --no-pager | grep 'refused a caller' | tail -n 3
rm -f /tmp/bcd-copy
`
	out, _ = runOnVM(t, wctx, f, m, copyCmd, fail)
	copyOut := strings.Join(out, "\n")
	if !strings.Contains(copyOut, "HELPER_PEER_REFUSED") || !strings.Contains(copyOut, "refused a caller") || strings.Contains(copyOut, "copy exited 124") {
		fail(fmt.Errorf("bcd node from /tmp/bcd-copy as bcd: want it to exit naming HELPER_PEER_REFUSED and the helper's journal to say refused a caller:\n%s", copyOut))
	}
	for _, l := range out {
		if strings.Contains(l, "HELPER_PEER_REFUSED") || strings.Contains(l, "refused a caller") || strings.HasPrefix(l, "copy exited") {
			t.Logf("copy: %s", l)
		}
	}
	if nn, err := waitReadyNode(wctx, f, m.node, func(x FleetNode) bool { return x.ID == m.node }, 2*time.Minute); err != nil {
		fail(fmt.Errorf("after the refused copy: %w", err))
	} else if nn.SessionID != n.SessionID {
		t.Logf("note: the node's session changed while the copy ran (%d → %d)", n.SessionID, nn.SessionID)
	}

	// --- A rollout of 0.1.1: the helper verifies, copies into root's slots
	// and swaps; the new bcd confirms through it.
	got := <-later
	if got.err != nil {
		fail(got.err)
	}
	r011 := got.rel
	steps := &updSteps{t: t, f: f, ctx: wctx, bc: bc, fail: fail, a: m, vms: []*updVM{m}}
	if out := bc("releases", "add", r011.Manifest); !strings.Contains(out, "release 0.1.1 (sequence 2) added") {
		fail(fmt.Errorf("releases add 0.1.1: %q", out))
	}
	at := time.Now()
	id := steps.createRollout("--version", "0.1.1", "--pool", "helper", "--waves", "100")
	steps.waitRollout(id, 15*time.Minute, "succeeded")
	took := time.Since(at)
	if nn := steps.nodeOf(m); !pki.SameVersion(nn.DaemonVersion, "0.1.1") {
		fail(fmt.Errorf("after rollout %s: node %+v, want bcd 0.1.1", id, nn))
	}
	u := steps.waitUpdate(m, "on 0.1.1 with floor 2 in /usr/local/lib/bcd", 3*time.Minute, func(u labUpdate) bool {
		return u.currentVersion() == "0.1.1" && u.Floor == 2 && !u.pending() && u.SlotsDir == "/usr/local/lib/bcd" && u.EntrypointLinked
	})
	if _, err := m.waitProbe(wctx, "entrypoint", 0, time.Minute, func(e string) bool { return e == "link /usr/local/lib/bcd/current" }); err != nil {
		fail(err)
	}
	checkHelperNode(t, wctx, f, m, "after the rollout", fail)
	out, _ = runOnVM(t, wctx, f, m, `stat -c '%n %U:%G %a' /usr/local/lib/bcd /usr/local/lib/bcd/bcd-a /usr/local/lib/bcd/bcd-b /usr/local/lib/bcd/slots.json`, fail)
	if len(out) != 4 {
		fail(fmt.Errorf("the slots after the rollout: %q", out))
	}
	for _, l := range out {
		if !strings.Contains(l, " root:root ") {
			fail(fmt.Errorf("the slots after the rollout are not all root's: %q", out))
		}
	}
	t.Logf("rollout %s of 0.1.1 succeeded in %s through the helper: %s; previous %s; %s", id, took.Round(time.Second), u.currentVersion(), u.previousVersion(), strings.Join(out, "; "))

	// --- nodes reboot: the node cannot reboot(2) as bcd; the helper does.
	// The install script must not run again on the next boot.
	runOnVM(t, wctx, f, m, "rm -f /etc/bcd-lab-install/install-bcd.sh", fail)
	boots := m.probe("boot")
	if len(boots) == 0 {
		fail(fmt.Errorf("the probe printed no boot id"))
	}
	before := boots[len(boots)-1]
	at = time.Now()
	cmdOut := bc("nodes", "reboot", m.node)
	cmdID := commandIDRe.FindString(cmdOut)
	if cmdID == "" {
		fail(fmt.Errorf("nodes reboot printed %q, want cmd_…", cmdOut))
	}
	after, err := m.waitProbe(wctx, "boot", len(boots), 10*time.Minute, func(b string) bool { return b != before })
	if err != nil {
		fail(fmt.Errorf("no new boot id after nodes reboot: %w", err))
	}
	rebooted := time.Since(at)
	if c := steps.waitCommand(cmdID, 10*time.Minute, "SUCCEEDED"); c.State != "SUCCEEDED" {
		fail(fmt.Errorf("node.reboot %s: %+v", cmdID, c))
	}
	if _, err := waitReadyNode(wctx, f, m.node, func(x FleetNode) bool { return x.ID == m.node && pki.SameVersion(x.DaemonVersion, "0.1.1") }, 10*time.Minute); err != nil {
		fail(fmt.Errorf("after the reboot: %w", err))
	}
	if uid := checkHelperNode(t, wctx, f, m, "after the reboot", fail); uid != bcdUID {
		fail(fmt.Errorf("bcd's uid changed across the reboot: %s → %s", bcdUID, uid))
	}
	t.Logf("nodes reboot %s (%s): boot id %s → %s in %s; node ready again on 0.1.1 after %s", m.node, cmdID, before, after,
		rebooted.Round(time.Second), time.Since(at).Round(time.Second))
	serial, _ := os.ReadFile(m.vm.Serial)
	logConsole(t, m.name, serial)
	t.Logf("TestDebianHelper: %s in all", time.Since(began).Round(time.Second))
}

var (
	helperNodeRe    = regexp.MustCompile(`^node: Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+Gid:\s+(\d+)\s+\d+\s+\d+\s+\d+\s+CapPrm:\s+([0-9a-f]+)\s+CapEff:\s+([0-9a-f]+)\s+exe (\S+)`)
	helperHelperRe  = regexp.MustCompile(`^helper: Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+CapEff:\s+([0-9a-f]+)\s+exe (\S+)`)
	helperAccountRe = regexp.MustCompile(`^account: uid (\d+) groups (\S+)`)
)

// checkHelperNode runs helperStatus on the machine and checks it: both
// services active; bcd.service's main process with bcd's uid in all four
// places and no effective or permitted capability, running the entrypoint
// (or a slot it links to); bcd-helper.service's as root; bcd in no tss
// group and the old udev rule gone; node.key a TPM record that the node
// process has no TPM device open for. It returns bcd's uid.
func checkHelperNode(t *testing.T, ctx context.Context, f *Fleet, m *updVM, when string, fail func(error)) string {
	t.Helper()
	out, rc := runOnVM(t, ctx, f, m, helperStatus, fail)
	lines := map[string]string{}
	for _, l := range out {
		if k, _, ok := strings.Cut(l, ": "); ok {
			lines[k] = l
		}
	}
	all := strings.Join(out, "\n")
	bad := func(format string, args ...any) {
		t.Helper()
		fail(fmt.Errorf("%s: %s:\n%s", when, fmt.Sprintf(format, args...), all))
	}
	if rc != 0 || lines["states"] != "states: active active" {
		bad("bcd-helper.service and bcd.service are not both active (exit %d)", rc)
	}
	acc := helperAccountRe.FindStringSubmatch(lines["account"])
	if acc == nil {
		bad("no account line")
	}
	uid := acc[1]
	if strings.Contains(","+acc[2]+",", ",tss,") {
		bad("bcd is still in tss: the script's upgrade run should have taken it out")
	}
	node := helperNodeRe.FindStringSubmatch(lines["node"])
	if node == nil {
		bad("no node status line")
	}
	for _, id := range node[1:5] {
		if id != uid {
			bad("bcd.service's main process has uids %v, want bcd's %s everywhere", node[1:5], uid)
		}
	}
	if node[6] != "0000000000000000" || node[7] != "0000000000000000" {
		bad("bcd.service's main process has CapPrm %s CapEff %s, want none", node[6], node[7])
	}
	if !strings.HasPrefix(node[8], "/usr/local/") {
		bad("bcd.service runs %s, not the installed bcd", node[8])
	}
	h := helperHelperRe.FindStringSubmatch(lines["helper"])
	if h == nil || h[1] != "0" || h[2] != "0" {
		bad("bcd-helper.service's main process is not root's")
	}
	if !strings.HasPrefix(lines["node fds"], "node fds: ") || !strings.HasSuffix(lines["node fds"], "; tpm: .") {
		bad("the node process has a TPM device open (or its fds were not listed)")
	}
	if lines["udev rule"] != "udev rule: absent" {
		bad("/etc/udev/rules.d/60-bcd-tpm.rules is still there")
	}
	if lines["node.key"] != "node.key: -----BEGIN BCD TPM NODE KEY-----" {
		bad("node.key is not a TPM key's record")
	}
	t.Logf("%s: %s | %s | %s | %s", when, lines["node"], lines["helper"], lines["account"], lines["node fds"])
	return uid
}
