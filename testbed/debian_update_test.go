//go:build e2edebian

package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/nodeagent/installscript"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// probeScript is the lab's eyes inside a self-updating machine (the lab has
// no ssh): a loop that prints on the serial console, each time one of them
// changes (and every eighth round anyway), what bcd update -o json says,
// where /usr/local/bin/bcd points, bcd.service's and bcd-rollback.service's
// states (with the rollback unit's log) and the node's id; and that runs, in
// order, the commands the test publishes for this machine on the lab's image
// server (cmd-1.sh, cmd-2.sh, …, fetched through the site's proxy), printing
// their output and exit code. A command runs once; the next is only looked
// for after it, and the next one's number survives a reboot
// (/var/lib/bcd-lab-probe.next), so a rebooted machine runs no command
// twice. Each boot it prints the kernel's boot id.
const probeScript = `#!/bin/sh
set -u
d=/etc/bcd-lab-probe
base=$(cat $d/url)
proxy=''
read -r cmdline </proc/cmdline
for w in $cmdline; do
	case $w in bcd.proxy=*) proxy=${w#bcd.proxy=} ;; esac
done
# The commands (an install script rerun) reach the api through the proxy too.
export HTTPS_PROXY="$proxy" https_proxy="$proxy"
say() { printf 'bcd-lab: %s\n' "$*"; }
# changed KEY VALUE: VALUE is not the one last printed under KEY.
changed() {
	f=/run/bcd-lab-probe.$1
	if [ -f "$f" ] && [ "$(cat "$f")" = "$2" ]; then return 1; fi
	printf '%s' "$2" >"$f"
}
n=$(cat /var/lib/bcd-lab-probe.next 2>/dev/null || echo 1)
round=0
while :; do
	# Every line again now and then: one that the kernel's messages garbled
	# on the console gets another chance.
	round=$((round + 1))
	if [ $((round % 8)) = 0 ]; then rm -f /run/bcd-lab-probe.*; fi
	if [ -e /usr/local/bin/bcd ] && [ -f /etc/bcd/config.toml ]; then
		if out=$(/usr/local/bin/bcd update -o json 2>&1); then
			u=$(printf '%s' "$out" | tr -d '\r\n' | tr -s ' ')
			changed update "$u" && say "update: $u"
		else
			u=$(printf '%s' "$out" | tr '\r\n' '  ')
			changed update-error "$u" && say "update-error: $u"
		fi
	fi
	if [ -L /usr/local/bin/bcd ]; then
		e="link $(readlink /usr/local/bin/bcd)"
	elif [ -f /usr/local/bin/bcd ]; then
		e="file $(stat -c 'inode %i size %s' /usr/local/bin/bcd)"
	else
		e=absent
	fi
	changed entrypoint "$e" && say "entrypoint: $e"
	b=$(cat /proc/sys/kernel/random/boot_id)
	changed boot "$b" && say "boot: $b"
	if [ -f /var/lib/bcd/identity.json ]; then
		i=$(grep -o '"node_id": *"[^"]*"' /var/lib/bcd/identity.json)
		changed identity "$i" && say "identity: $i"
	fi
	s=$(systemctl show bcd.service -p ActiveState -p SubState -p NRestarts -p DropInPaths | tr '\n' ' ')
	changed service "$s" && say "bcd.service: $s"
	r=$(systemctl show bcd-rollback.service -p LoadState -p ActiveState -p Result -p ExecMainExitTimestampMonotonic | tr '\n' ' ')
	if changed rollback "$r"; then
		say "rollback: $r| $(journalctl -u bcd-rollback.service -o cat -n 6 --no-pager 2>/dev/null | tr '\n' '|')"
	fi
	if curl -fsS --max-time 10 -x "$proxy" -o /run/bcd-lab-cmd.sh "$base/cmd-$n.sh" 2>/dev/null; then
		say "cmd $n: starting"
		sh /run/bcd-lab-cmd.sh </dev/null >/run/bcd-lab-cmd.log 2>&1
		rc=$?
		sed "s/^/bcd-lab: cmd $n: /" /run/bcd-lab-cmd.log
		say "cmd $n: exited $rc"
		n=$((n + 1))
		echo "$n" >/var/lib/bcd-lab-probe.next
		sync
	fi
	sleep 2
done
`

// probeUnit runs probeScript from the start of the boot.
const probeUnit = `[Unit]
Description=bcd lab: print bcd's slots, entrypoint and rollback unit on the serial console; run the test's commands

[Service]
Type=simple
ExecStart=/usr/local/sbin/bcd-lab-probe
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
`

// labUpdate is what bcd update -o json prints, and the line it came in.
type labUpdate struct {
	selfupdate.Status
	raw string
}

// slot is the named slot's record ("a" or "b").
func (u labUpdate) slot(name string) selfupdate.Slot { return u.Slots[name] }

func (u labUpdate) currentVersion() string  { return u.slot(u.Current).Version }
func (u labUpdate) previousVersion() string { return u.slot(u.Previous).Version }
func (u labUpdate) pending() bool           { return u.Pending != nil }
func (u labUpdate) failed(version string) bool {
	for _, f := range u.Failed {
		if pki.SameVersion(f.Version, version) {
			return true
		}
	}
	return false
}

// labRelease is one signed release of the lab's, its bare linux/amd64
// binary published in serve's downloads directory.
type labRelease struct {
	Version  string
	Sequence int
	Dir      string // its DIST
	Manifest string
}

// updVM is one of TestDebianSelfUpdate's machines.
type updVM struct {
	name, mac string
	vm        *VM
	bootAt    time.Time
	node      string // its node id
	cmds      int    // commands published so far
}

var (
	probeLine   = regexp.MustCompile(`bcd-lab: (update|update-error|entrypoint|boot|identity|bcd\.service|rollback): ([^\r\n]*)`)
	identityRe  = regexp.MustCompile(`"node_id"\s*:\s*"(n_[a-z0-9]+)"`)
	releaseIDRe = regexp.MustCompile(`\bro_[A-Za-z0-9]+`)
	commandIDRe = regexp.MustCompile(`\bcmd_[A-Za-z0-9]+`)
)

// probe returns the values the probe printed under kind, in order, with the
// kernel's messages that cut into them taken out.
func (m *updVM) probe(kind string) []string {
	b, _ := os.ReadFile(m.vm.Serial)
	var out []string
	for _, sub := range probeLine.FindAllStringSubmatch(stripKernelMessages(string(b)), -1) {
		if sub[1] == kind {
			out = append(out, strings.TrimSpace(sub[2]))
		}
	}
	return out
}

// last is the probe's last value under kind ("" before the first).
func (m *updVM) last(kind string) string {
	v := m.probe(kind)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// waitProbe waits until one of the probe's values under kind, after the
// first since, satisfies ok, and returns it.
func (m *updVM) waitProbe(ctx context.Context, kind string, since int, timeout time.Duration, ok func(string) bool) (string, error) {
	var found string
	err := waitFor(ctx, timeout, func() bool {
		v := m.probe(kind)
		for i := since; i < len(v); i++ {
			if ok(v[i]) {
				found = v[i]
				return true
			}
		}
		return false
	})
	if err != nil {
		return "", fmt.Errorf("%s: the probe printed no %s line as wanted within %s (last %q)", m.name, kind, timeout, m.last(kind))
	}
	return found, nil
}

// update is the last bcd update -o json the probe printed.
func (m *updVM) update() (labUpdate, error) {
	all := m.probe("update")
	if len(all) == 0 {
		return labUpdate{}, fmt.Errorf("%s: the probe printed no bcd update yet", m.name)
	}
	return parseUpdate(m.name, all[len(all)-1])
}

func parseUpdate(name, raw string) (labUpdate, error) {
	var u labUpdate
	if err := json.Unmarshal([]byte(raw), &u); err != nil {
		return u, fmt.Errorf("%s: bcd update -o json: %v: %s", name, err, raw)
	}
	u.raw = raw
	return u, nil
}

// TestDebianSelfUpdate is issue 14's proof in the Debian flavour: bcd
// updates itself under real systemd, from releases scripts/release.sh built
// and signed, on two machines the install script set up (TestDebianFleet's
// script machine, twice). The control plane trusts two release keys (serve
// --release-pins K1,K2); the machines pin only K1. See the steps below; the
// machines' own view comes from a probe (probeScript) on their consoles.
func TestDebianSelfUpdate(t *testing.T) {
	lab := newDebianLab(t, "shellcheck")
	kernel, began, dir, repo, bin, ramdisk, image := lab.kernel, lab.began, lab.dir, lab.repo, lab.bin, lab.ramdisk, lab.image
	probe := filepath.Join(dir, "bcd-lab-probe")
	if err := os.WriteFile(probe, []byte(probeScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("shellcheck", "-s", "sh", probe).CombinedOutput(); err != nil {
		t.Fatalf("shellcheck bcd-lab-probe: %v\n%s", err, out)
	}

	// The keys: K1 the machines pin, K2 only the operator trusts.
	k1, pin1 := releaseKey(t, bin, dir, "k1")
	k2, pin2 := releaseKey(t, bin, dir, "k2")
	downloads := filepath.Join(dir, "downloads")
	if err := os.MkdirAll(downloads, 0o755); err != nil {
		t.Fatal(err)
	}
	build := func(version string, seq int, tags string) (labRelease, error) {
		return buildLabRelease(repo, bin.BetterCompute, dir, downloads, version, seq, tags, "24h", k1)
	}
	r010, err := build("0.1.0", 1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("release 0.1.0 built and signed (%s)", time.Since(began).Round(time.Second))

	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: bin, Kernel: kernel, Ramdisk: ramdisk, Image: image, Log: testLog{t},
		Downloads: downloads, ProxyAllow: []string{apiAddr}, ServeArgs: []string{"--release-pins", pin1 + "," + pin2}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	a := &updVM{name: "upd1", mac: "52:54:00:31:00:21"}
	b := &updVM{name: "upd2", mac: "52:54:00:31:00:22"}
	vms := []*updVM{a, b}
	fail := func(err error) {
		t.Helper()
		var s strings.Builder
		for _, m := range vms {
			if m.vm != nil {
				s.WriteString(m.vm.Tail(80))
				// The lab's own lines, the whole story of the machine, and
				// its boots.
				serial, _ := os.ReadFile(m.vm.Serial)
				lines := regexp.MustCompile(`bcd-lab: [^\r\n]*`).FindAllString(stripKernelMessages(string(serial)), -1)
				if len(lines) > 150 {
					lines = lines[len(lines)-150:]
				}
				fmt.Fprintf(&s, "--- %s: %d boot(s); its last %d bcd-lab lines:\n%s\n", m.name,
					strings.Count(string(serial), "Linux version "), len(lines), strings.Join(lines, "\n"))
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

	// The other releases build while the machines boot and install, one
	// after the other (the machines need the cores too).
	type built struct {
		rel  labRelease
		took time.Duration
		err  error
	}
	builds := []struct {
		version string
		seq     int
		tags    string
	}{{"0.1.1", 2, ""}, {"0.1.2", 3, "labfault_nowelcome"}, {"0.1.3", 4, "labfault_crash"}, {"0.1.4", 5, ""}, {"0.1.5", 6, ""}}
	later := map[string]chan built{}
	for _, v := range builds {
		later[v.version] = make(chan built, 1)
	}
	bctx, stopBuilds := context.WithCancel(ctx)
	defer stopBuilds()
	go func() {
		for _, v := range builds {
			if bctx.Err() != nil {
				return
			}
			at := time.Now()
			r, err := build(v.version, v.seq, v.tags)
			later[v.version] <- built{r, time.Since(at), err}
		}
	}()
	releases := map[string]labRelease{"0.1.0": r010}
	release := func(version string) labRelease {
		t.Helper()
		if r, ok := releases[version]; ok {
			return r
		}
		got := <-later[version]
		if got.err != nil {
			fail(got.err)
		}
		t.Logf("release %s (sequence %d) built and signed in %s", version, got.rel.Sequence, got.took.Round(time.Second))
		releases[version] = got.rel
		return got.rel
	}

	// --- Two machines, each set up by the install script from release 0.1.0.
	seed := filepath.Join(dir, "seed")
	os.MkdirAll(seed, 0o700)
	script, err := installScript(bin, f, "upd", r010, pin1)
	if err != nil {
		fail(err)
	}
	for _, m := range vms {
		tok := regexp.MustCompile(`bcjt_[A-Za-z0-9_-]+`).FindString(bc("tokens", "create", "--role", "node", "--pool", "upd", "--site", "lab"))
		if tok == "" {
			fail(fmt.Errorf("tokens create printed no token"))
		}
		md := filepath.Join(seed, m.name)
		os.MkdirAll(md, 0o700)
		for name, data := range map[string]string{"install-bcd.sh": script, "join-token": tok + "\n",
			"name": m.name + "\n", "url": f.PublishURL("lab/"+m.name) + "\n", "unit": probeUnit} {
			if err := os.WriteFile(filepath.Join(md, name), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		disk := filepath.Join(dir, m.name+".img")
		// A plain Debian, the script and its token, and the probe.
		if err := PlainDebianDisk(image, disk, []string{"/etc/bcd-lab-install", "/etc/bcd-lab-probe"}, []DebianSeed{
			{Path: "/etc/bcd-lab-install/install-bcd.sh", Src: filepath.Join(md, "install-bcd.sh"), Mode: 0o600},
			{Path: "/etc/bcd-lab-install/join-token", Src: filepath.Join(md, "join-token"), Mode: 0o600},
			{Path: "/etc/bcd-lab-install/ca.crt", Src: f.ServingCACert(), Mode: 0o644},
			{Path: "/etc/bcd-lab-probe/name", Src: filepath.Join(md, "name"), Mode: 0o644},
			{Path: "/etc/bcd-lab-probe/url", Src: filepath.Join(md, "url"), Mode: 0o644},
			{Path: "/usr/local/sbin/bcd-lab-probe", Src: probe, Mode: 0o755},
			{Path: "/etc/systemd/system/bcd-lab-probe.service", Src: filepath.Join(md, "unit"), Mode: 0o644},
			{Path: "/etc/systemd/system/multi-user.target.wants/bcd-lab-probe.service", Link: "/etc/systemd/system/bcd-lab-probe.service"},
		}); err != nil {
			t.Fatal(err)
		}
		m.bootAt = time.Now()
		if m.vm, err = f.StartDiskVM(m.name, m.mac, disk); err != nil {
			fail(err)
		}
		defer m.vm.Stop()
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Minute)
	defer cancel()
	for _, m := range vms {
		exit, err := m.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: install script exited \d+`))
		if err != nil {
			fail(err)
		}
		if !strings.HasSuffix(exit, " 0") {
			fail(fmt.Errorf("%s: %s", m.name, exit))
		}
		if err := waitFor(wctx, 5*time.Minute, func() bool {
			if sub := identityRe.FindStringSubmatch(m.last("identity")); sub != nil {
				m.node = sub[1]
			}
			return m.node != ""
		}); err != nil {
			fail(fmt.Errorf("%s: the probe printed no identity.json with a node id", m.name))
		}
		n, err := waitReadyNode(wctx, f, m.node, func(n FleetNode) bool { return n.ID == m.node }, 10*time.Minute)
		if err != nil {
			fail(fmt.Errorf("%s: %w", m.name, err))
		}
		if n.Pool != "upd" || !pki.SameVersion(n.DaemonVersion, "0.1.0") {
			fail(fmt.Errorf("%s: node %+v, want pool upd and bcd 0.1.0", m.name, n))
		}
		if _, err := m.waitProbe(wctx, "entrypoint", 0, time.Minute, func(e string) bool { return strings.HasPrefix(e, "file ") }); err != nil {
			fail(fmt.Errorf("%s: /usr/local/bin/bcd after the install script is not the script's plain file: %w", m.name, err))
		}
		if _, err := m.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`)); err != nil {
			fail(err)
		}
		serial, _ := os.ReadFile(m.vm.Serial)
		if err := checkHardened(string(serial), installscript.UnitPath); err != nil {
			fail(fmt.Errorf("%s: %w", m.name, err))
		}
		t.Logf("%s: node %s ready on bcd %s; boot → node ready %s", m.name, m.node, n.DaemonVersion, time.Since(m.bootAt).Round(time.Second))
	}
	// The probe's command channel works before anything depends on it.
	if out, rc := runOnVM(t, wctx, f, a, "systemctl is-active bcd.service; cat /etc/systemd/system/bcd.service.d/40-bcd-update.conf", fail); rc != 0 ||
		len(out) == 0 || out[0] != "active" {
		fail(fmt.Errorf("%s: is-active and 40-bcd-update.conf: exit %d, %q", a.name, rc, out))
	} else {
		t.Logf("%s: 40-bcd-update.conf: %s", a.name, strings.Join(out[1:], " | "))
	}
	t.Logf("setup: both machines ready after %s", time.Since(began).Round(time.Second))

	steps := &updSteps{t: t, f: f, bc: bc, fail: fail, ctx: wctx, a: a, b: b, vms: vms, release: release,
		bin: bin, dir: dir, downloads: downloads, k1: k1, k2: k2, pin1: pin1, watch: &labWatch{since: map[string]time.Time{}, spans: map[string][][2]time.Time{}}}
	go steps.watch.run(wctx, vms)
	steps.rollout()
	steps.noWelcome()
	steps.crashLoop()
	steps.refusals()
	steps.rerun()
	for _, m := range vms {
		serial, _ := os.ReadFile(m.vm.Serial)
		logConsole(t, m.name, serial)
	}
	t.Logf("TestDebianSelfUpdate: %s in all", time.Since(began).Round(time.Second))
}

// updSteps are TestDebianSelfUpdate's steps, in the order they run, on the
// lab it set up.
type updSteps struct {
	t       *testing.T
	f       *Fleet
	ctx     context.Context
	bc      func(args ...string) string
	fail    func(error)
	a, b    *updVM
	vms     []*updVM
	release func(version string) labRelease
	bin     FleetBinaries
	dir     string
	// downloads is serve's downloads directory; k1 and k2 the release keys
	// (k1 the machines' pin1).
	downloads, k1, k2, pin1 string
	// x is the machine that took the failed 0.1.2 first; y the other.
	x, y *updVM
	// retry is step 2's daemon.upgrade of 0.1.2 after --clear-failed, which
	// ends (swapped back) while step 3 runs.
	retry string
	watch *labWatch
}

func (s *updSteps) logf(format string, args ...any) {
	s.t.Helper()
	s.t.Logf(format, args...)
}

// rollout is step 1: a rollout of 0.1.1 in waves 50,100 succeeds.
func (s *updSteps) rollout() {
	t := s.t
	r := s.release("0.1.1")
	if out := s.bc("releases", "add", r.Manifest); !strings.Contains(out, "release 0.1.1 (sequence 2) added") {
		s.fail(fmt.Errorf("releases add 0.1.1: %q", out))
	}
	at := time.Now()
	id := s.createRollout("--version", "0.1.1", "--pool", "upd", "--waves", "50,100")
	ro := s.waitRollout(id, 15*time.Minute, "succeeded")
	took := time.Since(at)
	waves := map[int]int{}
	for _, n := range ro.Nodes {
		waves[n.Wave]++
		if n.State != "succeeded" {
			s.fail(fmt.Errorf("rollout %s succeeded, but node %s is %s %s", id, n.Node, n.State, n.Reason))
		}
	}
	if len(ro.Nodes) != 2 || len(waves) != 2 {
		s.fail(fmt.Errorf("rollout %s: nodes %+v, want one in each of two waves", id, ro.Nodes))
	}
	for _, m := range s.vms {
		if n := s.nodeOf(m); !pki.SameVersion(n.DaemonVersion, "0.1.1") {
			s.fail(fmt.Errorf("%s: node %+v, want bcd 0.1.1", m.name, n))
		}
		// The new binary reports the section once welcomed, maybe just after
		// the rollout saw it rejoin.
		s.waitSection(m, "SUCCEEDED for 0.1.1", 2*time.Minute, func(sec apitype.SectionStatus) bool {
			return sec.State == "SUCCEEDED" && pki.SameVersion(sec.Version, "0.1.1")
		})
		u := s.waitUpdate(m, "on 0.1.1 with floor 2", 3*time.Minute, func(u labUpdate) bool {
			return u.currentVersion() == "0.1.1" && u.Floor == 2 && !u.pending()
		})
		if u.previousVersion() != "0.1.0" || len(u.Slots) != 2 || u.slot("a").SHA256 == "" || u.slot("b").SHA256 == "" {
			s.fail(fmt.Errorf("%s: slots.json should record both slots (0.1.0 adopted, 0.1.1): %s", m.name, u.raw))
		}
		if !u.EntrypointLinked {
			s.fail(fmt.Errorf("%s: bcd update: %s, want the entrypoint linked to current", m.name, u.raw))
		}
		// The probe prints these after bcd update, in the same round or the next.
		for _, c := range []struct{ kind, want string }{
			{"entrypoint", "link /var/lib/bcd/bin/current"},
			{"rollback", "LoadState=loaded"},
			{"bcd.service", "/etc/systemd/system/bcd.service.d/50-bcd-rollback.conf"},
		} {
			if _, err := m.waitProbe(s.ctx, c.kind, 0, time.Minute, func(v string) bool { return strings.Contains(v, c.want) }); err != nil {
				s.fail(fmt.Errorf("after the first update: %w (want %s)", err, c.want))
			}
		}
	}
	t.Logf("step 1: rollout %s of 0.1.1 (waves 50,100) succeeded in %s; both nodes on 0.1.1, floor 2", id, took.Round(time.Second))
	for _, l := range ro.Timeline {
		t.Logf("step 1: timeline %s %s", l.At.Format("15:04:05"), l.Message)
	}
}

// noWelcome is step 2: 0.1.2 never reaches its Welcome, so the node that
// takes it swaps back by the deadline and the rollout pauses; a second
// rollout of it is refused until bcd update --clear-failed.
func (s *updSteps) noWelcome() {
	t := s.t
	r := s.release("0.1.2")
	s.bc("releases", "add", r.Manifest)
	at := time.Now()
	id := s.createRollout("--version", "0.1.2", "--pool", "upd", "--waves", "50,100")
	ro := s.waitRollout(id, 15*time.Minute, "paused")
	paused := time.Since(at)
	var failed []string
	for _, n := range ro.Nodes {
		if n.State == "failed" {
			failed = append(failed, n.Node)
		}
	}
	if len(failed) != 1 {
		s.fail(fmt.Errorf("rollout %s paused with nodes %+v, want exactly the first wave's one node failed", id, ro.Nodes))
	}
	s.x, s.y = s.a, s.b
	if s.b.node == failed[0] {
		s.x, s.y = s.b, s.a
	}
	x, y := s.x, s.y
	n := s.nodeOf(x)
	if !pki.SameVersion(n.DaemonVersion, "0.1.1") || n.DaemonSection == nil || n.DaemonSection.State != "FAILED" ||
		n.DaemonSection.Reason != "UpdateFailed" || !strings.Contains(n.DaemonSection.Message, "did not start") {
		s.fail(fmt.Errorf("%s: node %+v (section %+v), want back on 0.1.1, the daemon section FAILED UpdateFailed", x.name, n, n.DaemonSection))
	}
	u := s.waitUpdate(x, "0.1.2 failed, back on 0.1.1", 2*time.Minute, func(u labUpdate) bool {
		return u.failed("0.1.2") && u.currentVersion() == "0.1.1" && !u.pending()
	})
	if nv := s.nodeOf(y); !pki.SameVersion(nv.DaemonVersion, "0.1.1") {
		s.fail(fmt.Errorf("%s: the second wave's node left 0.1.1 while the rollout paused: %+v", y.name, nv))
	}
	t.Logf("step 2: rollout %s of 0.1.2 paused after %s (%s); %s: %s, %s", id,
		paused.Round(time.Second), ro.Reason, x.name, s.swapSpan(x), afterDeadline(u, "0.1.2", n.DaemonSection.Message))
	s.bc("rollouts", "abort", id)

	// A second rollout, of both nodes at once: x, which failed it, refuses
	// it at once; y, which never tried it, swaps back by the deadline too.
	id2 := s.createRollout("--version", "0.1.2", "--pool", "upd", "--waves", "100", "--max-unavailable", "2")
	sec := s.waitSection(x, "ReleaseRefused UPDATE_FAILED_BEFORE", 10*time.Minute, func(sec apitype.SectionStatus) bool {
		return sec.State == "FAILED" && sec.Reason == "ReleaseRefused" && pki.SameVersion(sec.Version, "0.1.2")
	})
	if !strings.HasPrefix(sec.Message, "UPDATE_FAILED_BEFORE") {
		s.fail(fmt.Errorf("%s: the second rollout of 0.1.2: %+v, want the message to start with UPDATE_FAILED_BEFORE", x.name, sec))
	}
	if u2, _ := x.update(); u2.pending() || u2.currentVersion() != "0.1.1" {
		s.fail(fmt.Errorf("%s: refused, but: %s", x.name, u2.raw))
	}
	t.Logf("step 2: rollout %s: %s refused 0.1.2 at once (%s)", id2, x.name, sec.Message)

	// --clear-failed, and the node takes 0.1.2 again when asked.
	if out, rc := runOnVM(t, s.ctx, s.f, x, "bcd update --clear-failed", s.fail); rc != 0 {
		s.fail(fmt.Errorf("%s: bcd update --clear-failed: exit %d: %q", x.name, rc, out))
	}
	s.waitUpdate(x, "no failed versions", 2*time.Minute, func(u labUpdate) bool { return len(u.Failed) == 0 })
	s.retry = s.upgrade(x, "--version", "0.1.2")
	t.Logf("step 2: after --clear-failed %s is sent 0.1.2 again (%s); it ends while step 3 runs", x.name, s.retry)

	// y's try ends the same way; then the rollout is over.
	var yState apitype.Rollout
	if err := waitFor(s.ctx, 10*time.Minute, func() bool {
		ro, err := s.showRollout(id2)
		yState = ro
		for _, n := range ro.Nodes {
			if n.Node == y.node {
				return err == nil && n.State == "failed"
			}
		}
		return false
	}); err != nil {
		s.fail(fmt.Errorf("rollout %s: %s did not fail 0.1.2: %+v", id2, y.name, yState))
	}
	if yState.State != "paused" {
		s.fail(fmt.Errorf("rollout %s: %s, want paused by the failures", id2, yState.State))
	}
	var yMessage string
	for _, n := range yState.Nodes {
		if n.Node == y.node {
			if n.Reason != "UpdateFailed" {
				s.fail(fmt.Errorf("rollout %s: %s failed with %s %s, want UpdateFailed", id2, y.name, n.Reason, n.Message))
			}
			yMessage = n.Message
		}
	}
	uy := s.waitUpdate(y, "0.1.2 failed, back on 0.1.1", 2*time.Minute, func(u labUpdate) bool {
		return u.failed("0.1.2") && u.currentVersion() == "0.1.1" && !u.pending()
	})
	t.Logf("step 2: rollout %s paused (%s); %s: %s, %s", id2, yState.Reason, y.name, s.swapSpan(y), afterDeadline(uy, "0.1.2", yMessage))
	s.bc("rollouts", "abort", id2)
}

// crashLoop is step 3: 0.1.3 exits at once, systemd's start limit gives up
// on bcd.service and bcd-rollback.service restores the previous slot.
func (s *updSteps) crashLoop() {
	t := s.t
	y := s.y
	r := s.release("0.1.3")
	s.bc("releases", "add", r.Manifest)
	before, err := y.update()
	if err != nil {
		s.fail(err)
	}
	rollbacks := len(y.probe("rollback"))
	at := time.Now()
	cmd := s.upgrade(y, "--version", "0.1.3")
	u := s.waitUpdate(y, "0.1.3 failed, back on 0.1.1", 10*time.Minute, func(u labUpdate) bool {
		return u.currentVersion() == "0.1.1" && !u.pending() && u.failed("0.1.3")
	})
	restored := time.Now()
	// The unit ran and says what it did.
	rb, err := y.waitProbe(s.ctx, "rollback", rollbacks, time.Minute, func(v string) bool {
		return strings.Contains(v, "Result=success") && !strings.Contains(v, "ExecMainExitTimestampMonotonic=0 ")
	})
	if err != nil {
		s.fail(fmt.Errorf("bcd-rollback.service did not run: %w", err))
	}
	if u.Floor != before.Floor {
		s.fail(fmt.Errorf("%s: the floor moved from %d to %d with a release that never confirmed", y.name, before.Floor, u.Floor))
	}
	c := s.waitCommand(cmd, 10*time.Minute, "FAILED")
	if c.Reason != "update-failed" || !strings.Contains(c.Message, "bcd 0.1.3 did not start") {
		s.fail(fmt.Errorf("%s: daemon.upgrade %s: %+v, want FAILED update-failed: bcd 0.1.3 did not start", y.name, cmd, c))
	}
	n, err := waitReadyNode(s.ctx, s.f, y.node, func(n FleetNode) bool { return n.ID == y.node && pki.SameVersion(n.DaemonVersion, "0.1.1") }, 5*time.Minute)
	if err != nil {
		s.fail(fmt.Errorf("%s: after the rollback: %w", y.name, err))
	}
	restarts := y.probe("bcd.service")
	t.Logf("step 3: %s: 0.1.3 crash-looped; back on %s %s after nodes upgrade (%s); %s: %s",
		y.name, n.DaemonVersion, restored.Sub(at).Round(time.Second), s.swapSpan(y), cmd, c.Message)
	t.Logf("step 3: %s: bcd-rollback: %s; bcd.service last: %s", y.name, rb, lastOf(restarts))

	// Step 2's retry on x has swapped back by now, or does so by its deadline.
	x := s.x
	c = s.waitCommand(s.retry, 10*time.Minute, "FAILED")
	if c.Reason != "update-failed" || !strings.Contains(c.Message, "bcd 0.1.2 did not start") {
		s.fail(fmt.Errorf("%s: the retried daemon.upgrade %s of 0.1.2: %+v, want FAILED update-failed: bcd 0.1.2 did not start", x.name, s.retry, c))
	}
	ux := s.waitUpdate(x, "0.1.2 failed again, back on 0.1.1", 5*time.Minute, func(u labUpdate) bool {
		return u.failed("0.1.2") && u.currentVersion() == "0.1.1" && !u.pending()
	})
	t.Logf("step 2 (end): %s back from the retried 0.1.2: %s, %s", x.name, s.swapSpan(x), afterDeadline(ux, "0.1.2", c.Message))
}

// refusals is step 4: four manifests each refused with its reason, nothing
// swapped.
func (s *updSteps) refusals() {
	t := s.t
	x := s.x
	base := s.release("0.1.1")
	bareOf := func(r labRelease) string {
		return filepath.Join(r.Dir, pki.BinaryName("bcd", r.Version, "linux", "amd64"))
	}
	// Releases made by signing a copy of 0.1.1's binary under another
	// version: refused before it would ever run.
	resign := func(version string, seq int, expires string, keys ...string) labRelease {
		r, err := signLabCopy(s.bin.BetterCompute, s.dir, s.downloads, bareOf(base), version, seq, expires, keys...)
		if err != nil {
			s.fail(err)
		}
		return r
	}
	expired := resign("0.1.8", 9, "40s", s.k1)
	expiresAt := time.Now().Add(40 * time.Second)
	untrusted := resign("0.1.7", 8, "24h", s.k2)
	mismatch := resign("0.1.6", 7, "24h", s.k1)
	// 0.1.6's binary is replaced after signing: the same size, one byte
	// other.
	swapped := filepath.Join(s.downloads, pki.BinaryName("bcd", "0.1.6", "linux", "amd64"))
	b, err := os.ReadFile(swapped)
	if err != nil {
		s.fail(err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(swapped, b, 0o755); err != nil {
		s.fail(err)
	}
	cases := []struct {
		what, manifest, version, code string
	}{
		{"signed only by K2", untrusted.Manifest, "0.1.7", "RELEASE_UNTRUSTED"},
		{"of 0.1.0, below the floor", s.release("0.1.0").Manifest, "0.1.0", "RELEASE_ROLLBACK"},
		{"whose binary was replaced after signing", mismatch.Manifest, "0.1.6", "DIGEST_MISMATCH"},
		{"expired", expired.Manifest, "0.1.8", "RELEASE_EXPIRED"},
	}
	for _, c := range cases {
		if c.code == "RELEASE_EXPIRED" {
			if d := time.Until(expiresAt.Add(5 * time.Second)); d > 0 {
				t.Logf("step 4: waiting %s for the 0.1.8 manifest to expire", d.Round(time.Second))
				time.Sleep(d)
			}
		}
		before, err := x.update()
		if err != nil {
			s.fail(err)
		}
		id := s.upgrade(x, "--manifest", c.manifest)
		cmd := s.waitCommand(id, 5*time.Minute, "FAILED")
		if cmd.Reason != "release-refused" || !strings.HasPrefix(cmd.Message, c.code) {
			s.fail(fmt.Errorf("%s: daemon.upgrade with the manifest %s: %+v, want FAILED release-refused %s…", x.name, c.what, cmd, c.code))
		}
		// Nothing swapped: no upgrade.json, the same slots and link.
		out, rc := runOnVM(t, s.ctx, s.f, x, "test ! -e /var/lib/bcd/upgrade.json && readlink /var/lib/bcd/bin/current && bcd update -o json | tr -d '\\n'", s.fail)
		if rc != 0 || len(out) != 2 {
			s.fail(fmt.Errorf("%s: after the refusal of %s: exit %d %q (upgrade.json present?)", x.name, c.version, rc, out))
		}
		after, err := parseUpdate(x.name, out[1])
		if err != nil {
			s.fail(err)
		}
		if after.Current != before.Current || after.currentVersion() != "0.1.1" || after.Floor != before.Floor || after.pending() ||
			after.slot("a") != before.slot("a") || after.slot("b") != before.slot("b") {
			s.fail(fmt.Errorf("%s: refusing %s changed the slots: before %s, after %s", x.name, c.version, before.raw, out[1]))
		}
		if n := s.nodeOf(x); !pki.SameVersion(n.DaemonVersion, "0.1.1") || !n.Connected {
			s.fail(fmt.Errorf("%s: node %+v after the refusal of %s", x.name, n, c.version))
		}
		t.Logf("step 4: %s: the manifest %s refused (%s): %s; current still %s on 0.1.1", x.name, c.what, id, cmd.Message, out[0])
	}
}

// rerun is step 5: the install script run again for 0.1.4 after the
// self-update makes /usr/local/bin/bcd a plain file; the next update (0.1.5)
// adopts it into the current slot and does not fall back.
func (s *updSteps) rerun() {
	t := s.t
	y := s.y
	r014 := s.release("0.1.4")
	script, err := installScript(s.bin, s.f, "upd", r014, s.pin1)
	if err != nil {
		s.fail(err)
	}
	at := time.Now()
	out, rc := runOnVM(t, s.ctx, s.f, y, script, s.fail)
	if rc != 0 {
		s.fail(fmt.Errorf("%s: the install script for 0.1.4: exit %d\n%s", y.name, rc, strings.Join(out, "\n")))
	}
	if _, err := y.waitProbe(s.ctx, "entrypoint", 0, time.Minute, func(e string) bool { return strings.HasPrefix(e, "file ") && e == y.last("entrypoint") }); err != nil {
		s.fail(fmt.Errorf("/usr/local/bin/bcd after the rerun is not the script's plain file: %w", err))
	}
	n, err := waitReadyNode(s.ctx, s.f, y.node, func(n FleetNode) bool { return n.ID == y.node && pki.SameVersion(n.DaemonVersion, "0.1.4") }, 10*time.Minute)
	if err != nil {
		s.fail(fmt.Errorf("%s: after the install script for 0.1.4: %w", y.name, err))
	}
	t.Logf("step 5: %s: install script for 0.1.4 rerun; node ready on %s after %s", y.name, n.DaemonVersion, time.Since(at).Round(time.Second))

	r015 := s.release("0.1.5")
	s.bc("releases", "add", r015.Manifest)
	at = time.Now()
	cmd := s.upgrade(y, "--version", "0.1.5")
	if c := s.waitCommand(cmd, 10*time.Minute, "SUCCEEDED"); c.State != "SUCCEEDED" {
		s.fail(fmt.Errorf("%s: daemon.upgrade 0.1.5: %+v", y.name, c))
	}
	u := s.waitUpdate(y, "on 0.1.5, previous 0.1.4", 3*time.Minute, func(u labUpdate) bool {
		return u.currentVersion() == "0.1.5" && !u.pending()
	})
	if u.previousVersion() != "0.1.4" || u.Floor != 6 {
		s.fail(fmt.Errorf("%s: after 0.1.5: previous %q, floor %d, want 0.1.4 adopted from the rerun and floor 6: %s", y.name, u.previousVersion(), u.Floor, u.raw))
	}
	if _, err := y.waitProbe(s.ctx, "entrypoint", 0, time.Minute, func(e string) bool {
		return e == "link /var/lib/bcd/bin/current" && e == y.last("entrypoint")
	}); err != nil || !u.EntrypointLinked {
		s.fail(fmt.Errorf("/usr/local/bin/bcd does not link to /var/lib/bcd/bin/current after 0.1.5: %v (%s)", err, u.raw))
	}
	if n := s.nodeOf(y); !pki.SameVersion(n.DaemonVersion, "0.1.5") {
		s.fail(fmt.Errorf("%s: node %+v, want bcd 0.1.5", y.name, n))
	}
	t.Logf("step 5: %s: 0.1.5 took over from the adopted 0.1.4 in %s (previous slot %s, floor %d)", y.name, time.Since(at).Round(time.Second), u.previousVersion(), u.Floor)
}

func lastOf(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func (s *updSteps) createRollout(args ...string) string {
	s.t.Helper()
	out := s.bc(append([]string{"rollouts", "create"}, args...)...)
	first, _, _ := strings.Cut(out, "\n")
	id := releaseIDRe.FindString(first)
	if id == "" {
		s.fail(fmt.Errorf("rollouts create printed %q, want ro_… on its first line", out))
	}
	return id
}

func (s *updSteps) showRollout(id string) (apitype.Rollout, error) {
	var ro apitype.Rollout
	out, err := s.f.BC("rollouts", "show", id, "-o", "json")
	if err != nil {
		return ro, err
	}
	if err := json.Unmarshal([]byte(out), &ro); err != nil {
		return ro, fmt.Errorf("rollouts show -o json: %v: %s", err, out)
	}
	return ro, nil
}

// waitRollout waits for the rollout to reach state, failing early when it
// reaches another final one.
func (s *updSteps) waitRollout(id string, timeout time.Duration, state string) apitype.Rollout {
	s.t.Helper()
	var ro apitype.Rollout
	var err error
	final := map[string]bool{"succeeded": true, "aborted": true, "paused": true}
	werr := waitFor(s.ctx, timeout, func() bool {
		ro, err = s.showRollout(id)
		return err == nil && (ro.State == state || final[ro.State])
	})
	if werr != nil || ro.State != state {
		s.fail(fmt.Errorf("rollout %s: not %s within %s: %+v (%v)", id, state, timeout, ro, err))
	}
	return ro
}

// upgrade sends daemon.upgrade to the machine's node and returns the command.
func (s *updSteps) upgrade(m *updVM, args ...string) string {
	s.t.Helper()
	out := s.bc(append([]string{"nodes", "upgrade", m.node}, args...)...)
	id := commandIDRe.FindString(out)
	if id == "" {
		s.fail(fmt.Errorf("nodes upgrade %s %s printed %q, want cmd_…", m.node, strings.Join(args, " "), out))
	}
	return id
}

// waitCommand waits for the command to end (SUCCEEDED, FAILED or another
// final state) and fails unless it is in state.
func (s *updSteps) waitCommand(id string, timeout time.Duration, state string) apitype.Command {
	s.t.Helper()
	var c apitype.Command
	err := waitFor(s.ctx, timeout, func() bool {
		out, err := s.f.BC("commands", "get", id, "-o", "json")
		if err != nil || json.Unmarshal([]byte(out), &c) != nil {
			return false
		}
		return protocol.Terminal(c.State)
	})
	if err != nil || c.State != state {
		s.fail(fmt.Errorf("command %s: not %s within %s: %+v", id, state, timeout, c))
	}
	return c
}

func (s *updSteps) nodeOf(m *updVM) FleetNode {
	s.t.Helper()
	nodes, err := s.f.Nodes()
	if err != nil {
		s.fail(err)
	}
	for _, n := range nodes {
		if n.ID == m.node {
			return n
		}
	}
	s.fail(fmt.Errorf("%s: node %s is not in nodes list", m.name, m.node))
	return FleetNode{}
}

// waitSection waits until the node's daemon section report satisfies ok.
func (s *updSteps) waitSection(m *updVM, what string, timeout time.Duration, ok func(apitype.SectionStatus) bool) apitype.SectionStatus {
	s.t.Helper()
	var last apitype.SectionStatus
	err := waitFor(s.ctx, timeout, func() bool {
		nodes, _ := s.f.Nodes()
		for _, n := range nodes {
			if n.ID == m.node && n.DaemonSection != nil {
				last = *n.DaemonSection
				return ok(last)
			}
		}
		return false
	})
	if err != nil {
		s.fail(fmt.Errorf("%s: the daemon section is not %s within %s (last %+v)", m.name, what, timeout, last))
	}
	return last
}

// waitUpdate waits until the probe's last bcd update satisfies ok.
func (s *updSteps) waitUpdate(m *updVM, what string, timeout time.Duration, ok func(labUpdate) bool) labUpdate {
	s.t.Helper()
	var u labUpdate
	var err error
	werr := waitFor(s.ctx, timeout, func() bool {
		u, err = m.update()
		return err == nil && ok(u)
	})
	if werr != nil {
		s.fail(fmt.Errorf("%s: bcd update is not %s within %s (last %s, %v)", m.name, what, timeout, u.raw, err))
	}
	return u
}

// swapSpan says how long the machine's last pending update lasted, as the
// watcher saw the probe's lines (they carry no host time; a window shorter
// than the probe's round, or a line the console garbled, may go unseen).
func (s *updSteps) swapSpan(m *updVM) string {
	s.watch.mu.Lock()
	defer s.watch.mu.Unlock()
	sp := s.watch.spans[m.name]
	if len(sp) == 0 {
		return "the probe showed no pending update"
	}
	last := sp[len(sp)-1]
	return fmt.Sprintf("pending for %s as the probe showed it", last[1].Sub(last[0]).Round(time.Second))
}

var deadlineRe = regexp.MustCompile(`deadline (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)`)

// afterDeadline says when the failed version was recorded after the deadline
// msg (the node's report of it) names, both on the machine's clock.
func afterDeadline(u labUpdate, version, msg string) string {
	for _, f := range u.Failed {
		if !pki.SameVersion(f.Version, version) {
			continue
		}
		if m := deadlineRe.FindStringSubmatch(msg); m != nil {
			if d, err := time.Parse(time.RFC3339, m[1]); err == nil {
				return fmt.Sprintf("swapped back %s after its deadline", f.At.Sub(d).Round(time.Second))
			}
		}
		return "failed: " + f.Reason
	}
	return "not failed"
}

// labWatch notes, per machine, when the probe's bcd update went from no
// pending update to one and back: TestDebianSelfUpdate's timings.
type labWatch struct {
	mu    sync.Mutex
	since map[string]time.Time      // pending seen since
	spans map[string][][2]time.Time // pending from, to
}

// run polls the machines' consoles until ctx ends.
func (w *labWatch) run(ctx context.Context, vms []*updVM) {
	for ctx.Err() == nil {
		for _, m := range vms {
			u, err := m.update()
			if err != nil {
				continue
			}
			w.mu.Lock()
			from, pending := w.since[m.name]
			switch {
			case u.pending() && !pending:
				w.since[m.name] = time.Now()
			case !u.pending() && pending:
				delete(w.since, m.name)
				w.spans[m.name] = append(w.spans[m.name], [2]time.Time{from, time.Now()})
			}
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runOnVM publishes script as the machine's next command, waits for the
// probe to run it, and returns its output lines and exit code.
func runOnVM(t *testing.T, ctx context.Context, f *Fleet, m *updVM, script string, fail func(error)) ([]string, int) {
	t.Helper()
	out, rc, err := tryOnVM(ctx, f, m, script, 10*time.Minute)
	if err != nil {
		fail(err)
	}
	return out, rc
}

// tryOnVM is runOnVM returning its error, waiting at most timeout: for a
// test's failure path, which gathers the machine's logs with it.
func tryOnVM(ctx context.Context, f *Fleet, m *updVM, script string, timeout time.Duration) ([]string, int, error) {
	m.cmds++
	n := m.cmds
	if _, err := f.Publish(fmt.Sprintf("lab/%s/cmd-%d.sh", m.name, n), []byte(script)); err != nil {
		return nil, 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exit, err := m.vm.WaitConsole(wctx, regexp.MustCompile(fmt.Sprintf(`bcd-lab: cmd %d: exited (\d+)`, n)))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: command %d: %w", m.name, n, err)
	}
	var rc int
	fmt.Sscanf(exit[strings.LastIndex(exit, " ")+1:], "%d", &rc)
	b, _ := os.ReadFile(m.vm.Serial)
	prefix := fmt.Sprintf("bcd-lab: cmd %d: ", n)
	var out []string
	for _, l := range regexp.MustCompile(regexp.QuoteMeta(prefix)+`[^\r\n]*`).FindAllString(stripKernelMessages(string(b)), -1) {
		l = strings.TrimPrefix(l, prefix)
		if l == "starting" || strings.HasPrefix(l, "exited ") {
			continue
		}
		out = append(out, l)
	}
	return out, rc, nil
}

// releaseKey makes a release signing key (release keygen) and returns its
// path and pin.
func releaseKey(t *testing.T, bin FleetBinaries, dir, name string) (string, string) {
	t.Helper()
	path := filepath.Join(dir, name+".key")
	out, err := exec.Command(bin.BetterCompute, "release", "keygen", "--out", path).Output()
	if err != nil {
		t.Fatalf("release keygen: %v", err)
	}
	return path, strings.TrimSpace(string(out))
}

// buildLabRelease builds bcd version for linux/amd64 with scripts/release.sh
// (GOFLAGS=-tags=TAGS for a lab-fault build), signs it with keys at seq,
// and publishes its bare binary in downloads.
func buildLabRelease(repo, signer, dir, downloads, version string, seq int, tags, expires string, keys ...string) (labRelease, error) {
	r := labRelease{Version: version, Sequence: seq, Dir: filepath.Join(dir, "rel-"+version)}
	r.Manifest = filepath.Join(r.Dir, pki.ManifestFile)
	goflags := ""
	if tags != "" {
		goflags = "-tags=" + tags
	}
	if err := runReleaseScript(repo, "VERSION="+version, "DIST="+r.Dir, "ARCHES=amd64", "PRODUCTS=bcd", "SIGNER="+signer,
		"GOFLAGS="+goflags, "BCD_RELEASE_KEYS="+strings.Join(keys, " "), fmt.Sprintf("BCD_RELEASE_SEQUENCE=%d", seq),
		"BCD_RELEASE_EXPIRES="+expires); err != nil {
		return r, err
	}
	name := pki.BinaryName("bcd", version, "linux", "amd64")
	return r, copyFile(filepath.Join(r.Dir, name), filepath.Join(downloads, name))
}

// signLabCopy makes a release of version from a copy of another release's
// bare binary (bytes that never run: the release is to be refused) and signs
// it with better-compute release sign, publishing the binary in downloads.
func signLabCopy(signer, dir, downloads, bare, version string, seq int, expires string, keys ...string) (labRelease, error) {
	r := labRelease{Version: version, Sequence: seq, Dir: filepath.Join(dir, "rel-"+version)}
	r.Manifest = filepath.Join(r.Dir, pki.ManifestFile)
	name := pki.BinaryName("bcd", version, "linux", "amd64")
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return r, err
	}
	if err := copyFile(bare, filepath.Join(r.Dir, name)); err != nil {
		return r, err
	}
	args := []string{"release", "sign", "--product", "bcd", "--version", version, "--sequence", fmt.Sprint(seq), "--expires", expires}
	for _, k := range keys {
		args = append(args, "--key", k)
	}
	if out, err := exec.Command(signer, append(args, r.Dir)...).CombinedOutput(); err != nil {
		return r, fmt.Errorf("release sign %s: %v: %s", version, err, out)
	}
	return r, copyFile(filepath.Join(r.Dir, name), filepath.Join(downloads, name))
}

// installScript generates the install script of release r for pool, pinning
// pin for self-update, with extra flags (--unprivileged, --attestor tpm).
func installScript(bin FleetBinaries, f *Fleet, pool string, r labRelease, pin string, extra ...string) (string, error) {
	out, err := exec.Command(bin.BetterCompute, append([]string{"daemon", "install-script", "--pool", pool, "--site", "lab",
		"--gateway-url", GatewayURL, "--base-url", APIURL, "--bcd-version", r.Version,
		"--release-manifest", r.Manifest, "--release-pins", pin, "--pki", f.PKIDir()}, extra...)...).Output()
	if err != nil {
		return "", fmt.Errorf("daemon install-script %s: %v", r.Version, err)
	}
	return string(out), nil
}
